"""Use case: refresh the per-shard lag and pending figures."""

from __future__ import annotations

from eco_router.application.ports import EventSource, RouterMetrics


class ObserveShards:
    """Read the group's lag and pending count on every shard and report them."""

    def __init__(self, *, source: EventSource, metrics: RouterMetrics) -> None:
        self._source = source
        self._metrics = metrics

    async def __call__(self) -> None:
        for stats in await self._source.shard_stats():
            self._metrics.shard_observed(stats)
