"""Use case: route what stayed pending too long on the shards this router holds."""

from __future__ import annotations

import logging

from eco_router.application.held_shards import HeldShards, Phase, streams_of
from eco_router.application.messages import Delivery
from eco_router.application.ports import Broadcaster, Clock, EventSource, RouterMetrics
from eco_router.application.route_batch import RouteBatch
from eco_router.domain.streams import shard_of

log = logging.getLogger(__name__)


class ReclaimPending:
    """Reclaim every shard this router reads once; returns how many entries were taken over.

    What a dead router held is taken over with its shard (see `ConsumeLoop`); this pass is for
    entries that stayed pending here: a batch that failed with an unexpected error, or poison.

    - Only shards being read are looked at, each under its fencing token, one after another.
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
        held: HeldShards,
        metrics: RouterMetrics,
        clock: Clock,
        min_idle_ms: int,
        page_size: int,
    ) -> None:
        self._source = source
        self._broadcaster = broadcaster
        self._route = route
        self._held = held
        self._metrics = metrics
        self._clock = clock
        self._min_idle_ms = min_idle_ms
        self._page_size = page_size
        self._family_of = {s: f for f in source.families for s in f.streams}

    async def __call__(self) -> int:
        await self._broadcaster.ping()
        total = 0
        for stream, token in self._held.tokens([Phase.READING]).items():
            total += await self._shard(stream, token)
        return total

    async def _shard(self, stream: str, token: int) -> int:
        started = self._clock.monotonic()
        cursor, claimed = "0-0", 0
        while True:
            page = await self._source.claim(
                stream,
                token=token,
                cursor=cursor,
                min_idle_ms=self._min_idle_ms,
                count=self._page_size,
            )
            if page.fenced:
                break
            if page.deliveries:
                claimed += len(page.deliveries)
                await self._route_claimed(page.deliveries, stream, token)
            if page.wrapped:
                break
            cursor = page.cursor
        if claimed:
            log.info("reclaimed %d entries from %s", claimed, stream)
        family = self._family_of[stream]
        self._metrics.reclaimed(
            family.domain, shard_of(stream), claimed, self._clock.monotonic() - started
        )
        return claimed

    async def _route_claimed(self, deliveries: list[Delivery], stream: str, token: int) -> None:
        # Claimed entries are in hand: the shard is not handed over before they settle.
        self._held.picked_up(streams_of(deliveries))
        try:
            await self._route(deliveries, {stream: token})
        finally:
            self._held.put_down(streams_of(deliveries))
