"""In-memory adapter of `RouterMetrics`: plain counters tests can read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from eco_router.application.port_values import ShardStats
from eco_router.application.ports import RouterMetrics
from eco_router.domain.rejection import RejectReason
from eco_router.domain.verdict import Verdict


class InMemoryRouterMetrics(RouterMetrics):
    """Totals of everything reported, keyed like the Prometheus labels."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.verdicts: Counter[tuple[str, Verdict]] = Counter()
        self.published: Counter[str] = Counter()
        self.latencies_ms: list[float] = []
        self.publish_errors = 0
        self.dead_letters: Counter[tuple[str, RejectReason]] = Counter()
        self.trimmed: Counter[tuple[str, int]] = Counter()
        self.reclaimed_entries: Counter[tuple[str, int]] = Counter()
        self.shards: dict[str, ShardStats] = {}
        self.held: dict[tuple[str, int], int] = {}
        self.takeovers: list[tuple[str, int, int]] = []
        self.leases_lost: Counter[tuple[str, int]] = Counter()
        self.routers = 0
        self.quarantined: set[tuple[str, int]] = set()
        self.restarts: Counter[str] = Counter()

    def batch_routed(self, *, size: int, seconds: float) -> None:
        self.batches.append(size)

    def events_judged(self, domain: str, verdict: Verdict, count: int) -> None:
        self.verdicts[(domain, verdict)] += count

    def events_published(self, domain: str, latencies_ms: Sequence[float]) -> None:
        self.published[domain] += len(latencies_ms)
        self.latencies_ms.extend(latencies_ms)

    def broadcast_failed(self, count: int) -> None:
        self.publish_errors += count

    def dead_lettered(self, domain: str, reason: RejectReason, count: int) -> None:
        self.dead_letters[(domain, reason)] += count

    def trimmed_before_ack(self, domain: str, shard: int, count: int) -> None:
        self.trimmed[(domain, shard)] += count

    def reclaimed(self, domain: str, shard: int, count: int, seconds: float) -> None:
        self.reclaimed_entries[(domain, shard)] += count

    def shard_observed(self, stats: ShardStats) -> None:
        self.shards[stats.stream] = stats

    def shard_held(self, domain: str, shard: int, since_ms: int | None) -> None:
        if since_ms is None:
            self.held.pop((domain, shard), None)
        else:
            self.held[(domain, shard)] = since_ms

    def taken_over(self, domain: str, shard: int, *, claimed: int, seconds: float) -> None:
        self.takeovers.append((domain, shard, claimed))

    def lease_lost(self, domain: str, shard: int) -> None:
        self.leases_lost[(domain, shard)] += 1

    def routers_alive(self, count: int) -> None:
        self.routers = count

    def shard_quarantined(self, domain: str, shard: int, quarantined: bool) -> None:
        if quarantined:
            self.quarantined.add((domain, shard))
        else:
            self.quarantined.discard((domain, shard))

    def task_restarted(self, task: str) -> None:
        self.restarts[task] += 1
