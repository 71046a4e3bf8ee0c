"""Use case: is this process able to route right now?"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from eco_router.application.errors import TransientError
from eco_router.application.feed_health import FeedHealth
from eco_router.application.ports import Broadcaster, EventSource, ReadinessMetrics
from eco_router.application.router_health import RouterHealth
from eco_router.application.router_service import RouterService

log = logging.getLogger(__name__)

OK = "ok"
# What a public port says of a failing check: the component, never its address or cause.
PUBLIC_REASONS = {
    "streams": "streams redis unreachable",
    "pubsub": "pubsub redis unreachable",
    "feed": "live feed interrupted",
    "router": "router not running",
}
QUARANTINED = "quarantined"
FAILING = "failing"
# Checks shown (and measured) but not gating readiness: a gateway whose viewer counts cannot be
# posted still streams every event, so it stays in rotation.
ADVISORY = frozenset({"presence"})


def is_ready(checks: Mapping[str, object]) -> bool:
    """Every check but the advisory ones is "ok"."""
    return all(value == OK for name, value in checks.items() if name not in ADVISORY)


def public_checks(checks: dict[str, str]) -> dict[str, str]:
    """The same checks with every failing one's text replaced by a short, fixed reason.

    A check's own text carries the driver's message (`Error 111 connecting to 10.0.0.7:6379`),
    which a public port must not show; the cause goes to the log (`CheckReadiness`).
    """
    return {name: OK if value == OK else public_reason(name) for name, value in checks.items()}


def public_reason(check: str) -> str:
    """`shard <stream>` is quarantined; the router's loops (`consumer`, `leases`...) fail."""
    if check.startswith("shard "):
        return QUARANTINED
    return PUBLIC_REASONS.get(check, f"{check} {FAILING}")


class CheckReadiness:
    """Ready when both servers answer and the router routes; returns every check by name.

    The router's checks come from its `RouterHealth`: each supervised loop (`leases`,
    `consumer`, `reclaimer`, `observer`) is "ok" unless it died or is retrying after a
    transient failure, and each quarantined shard is a failing check `shard <stream>` naming
    the cause. A process that does not route (a gateway-only `serve`) passes no router and
    is not asked about one. A process serving viewers has a `feed` check: "ok" unless its
    Pub/Sub reader is reconnecting or retrying after a failure; and a check per task of its
    own (`presence`, posting its viewer counts), by the same rules as the router's loops.

    Every outcome goes to `metrics`, so an alert sees what the kubelet's probe saw. A check
    that starts failing is logged with its cause once (not once per probe), and again when it
    is ok again: a public port shows only `public_checks`, so the log is where its cause is.
    """

    def __init__(
        self,
        *,
        source: EventSource,
        broadcaster: Broadcaster,
        router: RouterService | None,
        feed: FeedHealth | None = None,
        metrics: ReadinessMetrics | None = None,
        tasks: RouterHealth | None = None,
    ) -> None:
        self._tasks = tasks
        self._source = source
        self._broadcaster = broadcaster
        self._router = router
        self._feed = feed
        self._metrics = metrics
        self._failing: set[str] = set()

    async def __call__(self) -> dict[str, str]:
        checks: dict[str, str] = {}
        for name, ping in (("streams", self._source.ping), ("pubsub", self._broadcaster.ping)):
            try:
                await ping()
                checks[name] = OK
            except TransientError as error:
                checks[name] = f"unreachable: {error}"
        if self._router is not None:
            checks.update(self._router.health.checks())
        if self._feed is not None:
            checks.update(self._feed.checks())
        if self._tasks is not None:
            checks.update(self._tasks.checks())
        if self._metrics is not None:
            self._metrics.readiness_checked(checks)
        self._log_changes(checks)
        return checks

    def _log_changes(self, checks: dict[str, str]) -> None:
        failing = {name for name, value in checks.items() if value != OK}
        for name in sorted(failing - self._failing):
            log.info("not ready: %s: %s", name, checks[name])
        for name in sorted(self._failing - failing):
            log.info("ready again: %s", name)
        self._failing = failing
