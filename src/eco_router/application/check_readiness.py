"""Use case: is this process able to route right now?"""

from __future__ import annotations

from eco_router.application.errors import TransientError
from eco_router.application.feed_health import FeedHealth
from eco_router.application.ports import Broadcaster, EventSource, ReadinessMetrics
from eco_router.application.router_service import RouterService


class CheckReadiness:
    """Ready when both servers answer and the router routes; returns every check by name.

    The router's checks come from its `RouterHealth`: each supervised loop (`leases`,
    `consumer`, `reclaimer`, `observer`) is "ok" unless it died or is retrying after a
    transient failure, and each quarantined shard is a failing check `shard <stream>` naming
    the cause. A process that does not route (a gateway-only `serve`) passes no router and
    is not asked about one. A process serving viewers has a `feed` check: "ok" unless its
    Pub/Sub reader is reconnecting or retrying after a failure.

    Every outcome goes to `metrics`, so an alert sees what the kubelet's probe saw.
    """

    def __init__(
        self,
        *,
        source: EventSource,
        broadcaster: Broadcaster,
        router: RouterService | None,
        feed: FeedHealth | None = None,
        metrics: ReadinessMetrics | None = None,
    ) -> None:
        self._source = source
        self._broadcaster = broadcaster
        self._router = router
        self._feed = feed
        self._metrics = metrics

    async def __call__(self) -> dict[str, str]:
        checks: dict[str, str] = {}
        for name, ping in (("streams", self._source.ping), ("pubsub", self._broadcaster.ping)):
            try:
                await ping()
                checks[name] = "ok"
            except TransientError as error:
                checks[name] = f"unreachable: {error}"
        if self._router is not None:
            checks.update(self._router.health.checks())
        if self._feed is not None:
            checks.update(self._feed.checks())
        if self._metrics is not None:
            self._metrics.readiness_checked(checks)
        return checks
