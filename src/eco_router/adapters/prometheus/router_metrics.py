"""prometheus-client adapter of `RouterMetrics`, in the `event_router_` family."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from eco_router.application.port_values import ShardStats
from eco_router.application.ports import HealthMetrics, RouterMetrics
from eco_router.domain.rejection import RejectReason
from eco_router.domain.verdict import Verdict

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SIZE_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)


class PrometheusRouterMetrics(RouterMetrics):
    """Registers the router's metrics on `registry` (one registry per process or test)."""

    def __init__(self, registry: CollectorRegistry, health: HealthMetrics) -> None:
        self.registry = registry
        self._health = health
        self._events = Counter(
            "event_router_events",
            "Events judged, by domain and verdict.",
            ["domain", "verdict"],
            registry=registry,
        )
        self._batch_size = Histogram(
            "event_router_batch_size",
            "Entries per routed batch.",
            buckets=_SIZE_BUCKETS,
            registry=registry,
        )
        self._batch_seconds = Histogram(
            "event_router_batch_processing_seconds",
            "Time to route one batch: judge, apply, publish, ack.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._published = Counter(
            "event_router_published", "Events published.", ["domain"], registry=registry
        )
        self._end_to_end = Histogram(
            "event_router_end_to_end_latency_seconds",
            "Entry written (its id's time) to published.",
            ["domain"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._broadcast_errors = Counter(
            "event_router_publish_errors",
            "Events whose publish failed (kept unacked, published again later).",
            registry=registry,
        )
        self._dead_letters = Counter(
            "event_router_dead_letters",
            "Entries sent to the dead-letter stream, by reason.",
            ["domain", "reason"],
            registry=registry,
        )
        self._trimmed = Counter(
            "event_router_trimmed_before_ack",
            "Entries deleted from their stream before they were acked.",
            ["domain", "shard"],
            registry=registry,
        )
        self._reclaimed = Counter(
            "event_router_reclaimed",
            "Entries taken over from idle consumers.",
            ["domain", "shard"],
            registry=registry,
        )
        self._reclaim_seconds = Histogram(
            "event_router_reclaim_seconds",
            "Duration of one shard's reclaim pass.",
            ["domain", "shard"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._lag = Gauge(
            "event_router_consumer_lag",
            "Entries not yet delivered to the group (XINFO GROUPS lag).",
            ["domain", "shard"],
            registry=registry,
        )
        self._pending = Gauge(
            "event_router_pending",
            "Entries delivered but not acked (XINFO GROUPS pending).",
            ["domain", "shard"],
            registry=registry,
        )
        self._held = Gauge(
            "event_router_shard_held",
            "1 while this router holds the shard's lease, else 0.",
            ["domain", "shard"],
            registry=registry,
        )
        self._held_since = Gauge(
            "event_router_shard_held_since_seconds",
            "When this router took the shard's lease (Unix time; 0 when it does not hold it).",
            ["domain", "shard"],
            registry=registry,
        )
        self._takeovers = Counter(
            "event_router_takeovers",
            "Shards this router took over (it routed what the previous holder left first).",
            ["domain", "shard"],
            registry=registry,
        )
        self._takeover_seconds = Histogram(
            "event_router_takeover_seconds",
            "From taking a shard's lease to having routed what its previous holder left.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._leases_lost = Counter(
            "event_router_leases_lost",
            "Shards another router took while this one still held them (paused, cut off).",
            ["domain", "shard"],
            registry=registry,
        )
        self._routers = Gauge(
            "event_router_routers_alive",
            "Routers of the group alive at this router's last heartbeat.",
            registry=registry,
        )
        self._held_jobs = Gauge(
            "event_router_held_jobs",
            "Jobs whose records this router keeps in memory (EVENT_ROUTER_HELD_JOBS at most).",
            registry=registry,
        )

        # The children of the metrics every batch touches, by label values: `labels()` takes
        # a lock and builds its key on every call.
        self._judged: dict[tuple[str, Verdict], Counter] = {}
        self._published_in: dict[str, tuple[Counter, Histogram]] = {}

    def count_held_jobs(self, count: Callable[[], int]) -> None:
        """Report `count()`, the jobs whose records the state store holds, at each scrape."""
        self._held_jobs.set_function(count)

    def batch_routed(self, *, size: int, seconds: float) -> None:
        self._batch_size.observe(size)
        self._batch_seconds.observe(seconds)

    def events_judged(self, domain: str, verdict: Verdict, count: int) -> None:
        judged = self._judged.get((domain, verdict))
        if judged is None:
            judged = self._judged[(domain, verdict)] = self._events.labels(domain, verdict.value)
        judged.inc(count)

    def events_published(self, domain: str, latencies_ms: Sequence[float]) -> None:
        children = self._published_in.get(domain)
        if children is None:
            children = self._published_in[domain] = (
                self._published.labels(domain),
                self._end_to_end.labels(domain),
            )
        published, histogram = children
        published.inc(len(latencies_ms))
        for value in latencies_ms:
            histogram.observe(value / 1000)

    def broadcast_failed(self, count: int) -> None:
        self._broadcast_errors.inc(count)

    def dead_lettered(self, domain: str, reason: RejectReason, count: int) -> None:
        self._dead_letters.labels(domain, reason.value).inc(count)

    def trimmed_before_ack(self, domain: str, shard: int, count: int) -> None:
        self._trimmed.labels(domain, str(shard)).inc(count)

    def reclaimed(self, domain: str, shard: int, count: int, seconds: float) -> None:
        self._reclaimed.labels(domain, str(shard)).inc(count)
        self._reclaim_seconds.labels(domain, str(shard)).observe(seconds)

    def shard_observed(self, stats: ShardStats) -> None:
        shard = str(stats.shard)
        if stats.lag is not None:
            self._lag.labels(stats.family.domain, shard).set(stats.lag)
        self._pending.labels(stats.family.domain, shard).set(stats.pending)

    def shard_held(self, domain: str, shard: int, since_ms: int | None) -> None:
        self._held.labels(domain, str(shard)).set(0 if since_ms is None else 1)
        self._held_since.labels(domain, str(shard)).set(0 if since_ms is None else since_ms / 1000)

    def taken_over(self, domain: str, shard: int, *, claimed: int, seconds: float) -> None:
        self._takeovers.labels(domain, str(shard)).inc()
        self._takeover_seconds.observe(seconds)

    def lease_lost(self, domain: str, shard: int) -> None:
        self._leases_lost.labels(domain, str(shard)).inc()

    def routers_alive(self, count: int) -> None:
        self._routers.set(count)

    def shard_quarantined(self, domain: str, shard: int, quarantined: bool) -> None:
        self._health.shard_quarantined(domain, shard, quarantined)

    def task_restarted(self, task: str) -> None:
        self._health.task_restarted(task)
