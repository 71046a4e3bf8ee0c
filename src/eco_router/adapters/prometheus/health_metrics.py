"""prometheus-client adapter of `HealthMetrics`: supervised tasks and quarantined shards, for
the router and for a gateway's own tasks (which must not register the router's metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from eco_router.application.ports import HealthMetrics


class PrometheusHealthMetrics(HealthMetrics):
    """Registers the health metrics on `registry` (one registry per process or test)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._quarantined = Gauge(
            "event_router_shard_quarantined",
            "1 while a permanent error (a key of the wrong type, ...) keeps the shard out of "
            "routing, else 0.",
            ["domain", "shard"],
            registry=registry,
        )
        self._restarts = Counter(
            "event_router_task_restarts",
            "Supervised tasks restarted after dying with an unexpected error.",
            ["task"],
            registry=registry,
        )

    def shard_quarantined(self, domain: str, shard: int, quarantined: bool) -> None:
        self._quarantined.labels(domain, str(shard)).set(1 if quarantined else 0)

    def task_restarted(self, task: str) -> None:
        self._restarts.labels(task).inc()
