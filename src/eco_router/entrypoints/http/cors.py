"""Job event streams, and their cancel and input, for browsers on other origins
(`EVENT_ROUTER_CORS_ORIGINS`)."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

# The console and the ops endpoints stay same-origin: an admin's cookie never serves another site.
CORS_PATH_PREFIX = "/api/v1/"
# A browser sends the first two on an EventSource reconnect or from fetch-based SSE clients,
# the others with a cancel or an input (`control_routes.py`).
_ALLOWED_HEADERS = ("Authorization", "Last-Event-ID", "Content-Type", "Idempotency-Key")
_PREFLIGHT_MAX_AGE_S = 600


class JobEventsCors:
    """CORS with credentials for listed origins on `/api/v1/` only (reading events, POSTing a
    cancel or an input); other paths pass through."""

    def __init__(self, app: ASGIApp, *, origins: Sequence[str]) -> None:
        self._app = app
        self._cors = CORSMiddleware(
            app,
            allow_origins=list(origins),
            allow_credentials=True,
            allow_methods=["GET", "POST"],
            allow_headers=list(_ALLOWED_HEADERS),
            max_age=_PREFLIGHT_MAX_AGE_S,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CORS_PATH_PREFIX):
            await self._cors(scope, receive, send)
        else:
            await self._app(scope, receive, send)
