"""In-memory adapter of `GatewayMetrics`: plain counters tests can read."""

from __future__ import annotations

from collections import Counter

from eco_router.application.ports import GatewayMetrics


class InMemoryGatewayMetrics(GatewayMetrics):
    """Totals of everything the gateway reported."""

    def __init__(self) -> None:
        self.active = 0
        self.closed: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.snapshots = 0
        self.dropped = 0
        self.overtaken = 0
        self.feed_failures = 0
        self.feed_failing = False
        self.latencies_ms: list[float] = []

    def connection_opened(self) -> None:
        self.active += 1

    def connection_closed(self, reason: str) -> None:
        self.active -= 1
        self.closed[reason] += 1

    def events_sent(self, count: int, *, replayed: bool) -> None:
        self.sent["replay" if replayed else "live"] += count

    def snapshot_sent(self) -> None:
        self.snapshots += 1

    def events_dropped(self, count: int) -> None:
        self.dropped += count

    def event_overtaken(self) -> None:
        self.overtaken += 1

    def delivered(self, latency_ms: float) -> None:
        self.latencies_ms.append(latency_ms)

    def feed_failed(self) -> None:
        self.feed_failures += 1
        self.feed_failing = True

    def feed_recovered(self) -> None:
        self.feed_failing = False
