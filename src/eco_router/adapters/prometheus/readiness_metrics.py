"""prometheus-client adapter of `ReadinessMetrics`: what `/ready` answered, as gauges."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

from eco_router.application.check_readiness import is_ready
from eco_router.application.ports import ReadinessMetrics


class PrometheusReadinessMetrics(ReadinessMetrics):
    """`event_router_ready` and one `event_router_readiness_failing{check}` per check seen."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._ready = Gauge(
            "event_router_ready",
            "1 when the last readiness check passed, 0 when it failed (set on each /ready).",
            registry=registry,
        )
        self._failing = Gauge(
            "event_router_readiness_failing",
            "1 while the named readiness check fails, 0 once it passes or is gone.",
            ["check"],
            registry=registry,
        )
        self._seen: set[str] = set()

    def readiness_checked(self, checks: Mapping[str, str]) -> None:
        self._ready.set(1 if is_ready(checks) else 0)
        # A quarantined shard's check disappears when it routes again: its series goes to 0
        # rather than keeping its last value.
        for check in self._seen - checks.keys():
            self._failing.labels(check).set(0)
        for check, value in checks.items():
            self._failing.labels(check).set(0 if value == "ok" else 1)
        self._seen |= checks.keys()
