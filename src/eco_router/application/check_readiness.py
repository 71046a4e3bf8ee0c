"""Use case: is this process able to route right now?"""

from __future__ import annotations

from eco_router.application.errors import TransientError
from eco_router.application.ports import Broadcaster, EventSource
from eco_router.application.router_service import RouterService


class CheckReadiness:
    """Ready when both servers answer and the router's loops are alive; returns what failed.

    A process that does not route (a gateway-only `serve`) passes no router and is not
    asked about one.
    """

    def __init__(
        self, *, source: EventSource, broadcaster: Broadcaster, router: RouterService | None
    ) -> None:
        self._source = source
        self._broadcaster = broadcaster
        self._router = router

    async def __call__(self) -> dict[str, str]:
        checks: dict[str, str] = {}
        for name, ping in (("streams", self._source.ping), ("pubsub", self._broadcaster.ping)):
            try:
                await ping()
                checks[name] = "ok"
            except TransientError as error:
                checks[name] = f"unreachable: {error}"
        if self._router is not None:
            checks["router"] = "ok" if self._router.alive else "not running"
        return checks
