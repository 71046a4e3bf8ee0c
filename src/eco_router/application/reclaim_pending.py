"""Use case: route what stayed pending too long on the shards this router holds."""

from __future__ import annotations

import asyncio
import logging

from eco_router.application.backoff import Backoff
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.held_shards import HeldShards, Phase, streams_of
from eco_router.application.port_values import Delivery
from eco_router.application.ports import Broadcaster, Clock, EventSource, RouterMetrics
from eco_router.application.route_batch import RouteBatch
from eco_router.application.router_health import RouterHealth
from eco_router.domain.streams import families_by_stream, shard_of

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
      `TransientError`) or while the consumer is retrying after a transient failure (Redis out
      of memory, say): a claim counts as a delivery, and claims that cannot be routed would
      push good entries over `max_deliveries` into the dead-letter stream.
    - Claimed entries whose routing fails transiently are kept and routed again with back-off
      while the shard is held, never claimed again meanwhile: an episode counts one delivery.
    - A shard that fails does not stop the pass: a permanent error quarantines it, a
      transient one is warned about once per episode, and the next shard is reclaimed; the
      pass then raises the transient error, so that its loop tries again with back-off
      instead of waiting for its next interval.
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
        health: RouterHealth | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._source = source
        self._broadcaster = broadcaster
        self._route = route
        self._held = held
        self._metrics = metrics
        self._clock = clock
        self._min_idle_ms = min_idle_ms
        self._page_size = page_size
        self._family_of = families_by_stream(source.families)
        self._health = health or RouterHealth(
            clock=clock, metrics=metrics, families=source.families
        )
        self._backoff = backoff or Backoff()

    async def __call__(self) -> int:
        await self._broadcaster.ping()
        if self._health.troubled_now("consumer"):
            return 0
        total = 0
        failure: TransientError | None = None
        blocked = self._health.blocked()
        for stream, token in self._held.tokens([Phase.READING]).items():
            if stream in blocked:
                continue
            try:
                total += await self._shard(stream, token)
            except PermanentError as error:
                if error.key == stream:
                    self._health.quarantine(stream, error)
                else:
                    # A job's key, say: its entries stay pending and end as dead letters.
                    log.error("reclaiming %s refused: %s", stream, error)
            except TransientError as error:
                self._health.troubled("reclaimer", error)
                failure = error
        if failure is not None:
            raise failure
        self._health.untroubled("reclaimer")
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
            unsettled: list[Delivery] = deliveries
            while unsettled and self._still_reading(stream, token):
                try:
                    result = await self._route(unsettled, {stream: token})
                except TransientError as error:
                    self._health.troubled("reclaimer", error)
                else:
                    if result.fenced:
                        return
                    unsettled = result.unsettled
                    if not unsettled:
                        self._backoff.reset()
                        return
                    if result.error is not None:
                        self._health.troubled("reclaimer", result.error)
                await asyncio.sleep(self._backoff.next_delay())
        finally:
            self._held.put_down(streams_of(deliveries))

    def _still_reading(self, stream: str, token: int) -> bool:
        held = self._held.get(stream)
        return held is not None and held.token == token and held.phase is Phase.READING
