"""Use case: take over and route what crashed or stuck consumers left pending."""

from __future__ import annotations

import asyncio
import logging

from eco_router.application.ports import Broadcaster, Clock, EventSource, RouterMetrics
from eco_router.application.route_batch import RouteBatch
from eco_router.domain.streams import StreamFamily, shard_of

log = logging.getLogger(__name__)


class ReclaimPending:
    """Reclaim every shard of every family once; returns how many entries were taken over.

    - Families are reclaimed in parallel, the shards of one family one after another.
    - Each shard is followed cursor page by cursor page until the cursor wraps to `0-0`.
    - Claimed entries go through the ordinary routing, so over-delivered ones are
      dead-lettered and entries deleted before their ack are acked and counted.
    - Nothing is claimed while the broadcaster does not answer (the pass raises its
      `TransientError`): a claim counts as a delivery, and claims that cannot be published
      would push good entries over `max_deliveries` into the dead-letter stream.
    """

    def __init__(
        self,
        *,
        source: EventSource,
        broadcaster: Broadcaster,
        route: RouteBatch,
        metrics: RouterMetrics,
        clock: Clock,
        min_idle_ms: int,
        page_size: int,
    ) -> None:
        self._source = source
        self._broadcaster = broadcaster
        self._route = route
        self._metrics = metrics
        self._clock = clock
        self._min_idle_ms = min_idle_ms
        self._page_size = page_size

    async def __call__(self) -> int:
        await self._broadcaster.ping()
        counts = await asyncio.gather(*(self._family(f) for f in self._source.families))
        return sum(counts)

    async def _family(self, family: StreamFamily) -> int:
        total = 0
        for stream in family.streams:
            total += await self._shard(family, stream)
        return total

    async def _shard(self, family: StreamFamily, stream: str) -> int:
        started = self._clock.monotonic()
        cursor, claimed = "0-0", 0
        while True:
            page = await self._source.claim_idle(
                stream, cursor=cursor, min_idle_ms=self._min_idle_ms, count=self._page_size
            )
            if page.deliveries:
                claimed += len(page.deliveries)
                await self._route(page.deliveries)
            if page.wrapped:
                break
            cursor = page.cursor
        if claimed:
            log.info("reclaimed %d entries from %s", claimed, stream)
        self._metrics.reclaimed(
            family.domain, shard_of(stream), claimed, self._clock.monotonic() - started
        )
        return claimed
