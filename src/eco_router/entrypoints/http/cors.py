"""Job event streams for browsers on other origins (`EVENT_ROUTER_CORS_ORIGINS`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

# The console and the ops endpoints stay same-origin: an admin's cookie never serves another site.
CORS_PATH_PREFIX = "/api/v1/"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(\.{_LABEL})*|\[[0-9a-f:.]+\]")
# A browser sends these on an EventSource reconnect or from fetch-based SSE clients.
_ALLOWED_HEADERS = ("Authorization", "Last-Event-ID")
_PREFLIGHT_MAX_AGE_S = 600


def parse_origins(spec: str) -> tuple[str, ...]:
    """`https://app.example.com,http://localhost:3000` → the origins as browsers send them."""
    origins: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if part:
            origins.append(_origin(part))
    return tuple(dict.fromkeys(origins))


def _origin(text: str) -> str:
    if text == "*" or "*" in text:
        raise ValueError(
            f"{text!r}: wildcards are not allowed; credentials (the token cookie) need exact "
            "origins, e.g. https://app.example.com"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r} is not an origin (scheme://host[:port])") from None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"{text!r}: an origin starts with http:// or https://")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(
            f"{text!r}: an origin is scheme://host[:port] only, no path, query or trailing /"
        )
    if ":" in host:
        host = f"[{host}]"
    if not _HOST.fullmatch(host):
        raise ValueError(f"{text!r}: {host!r} is not a host name")
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


class JobEventsCors:
    """CORS with credentials for listed origins on `/api/v1/` only; other paths pass through."""

    def __init__(self, app: ASGIApp, *, origins: Sequence[str]) -> None:
        self._app = app
        self._cors = CORSMiddleware(
            app,
            allow_origins=list(origins),
            allow_credentials=True,
            allow_methods=["GET"],
            allow_headers=list(_ALLOWED_HEADERS),
            max_age=_PREFLIGHT_MAX_AGE_S,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CORS_PATH_PREFIX):
            await self._cors(scope, receive, send)
        else:
            await self._app(scope, receive, send)
