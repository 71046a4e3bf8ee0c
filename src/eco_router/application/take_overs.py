"""Take-overs under way: claiming what earlier holders left on a shard, page by page."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from eco_router.application.errors import PermanentError
from eco_router.application.held_shards import HeldShards, streams_of
from eco_router.application.port_values import Delivery
from eco_router.application.ports import Clock, EventSource, RouterMetrics
from eco_router.application.router_health import RouterHealth
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import families_by_stream, shard_of

log = logging.getLogger(__name__)


class TakeOvers:
    """Claims a taken-over shard's pending entries in id order and moves the shard to reading
    once the last page's entries are settled; drops a shard another router took.

    - A page moves the shard's position past the entries it claimed: a previous holder that
      had not noticed its loss may have read past where the take-over began, and reads that
      bring nothing would otherwise wait after them and return at once.
    - A take-over from another holder is measured and logged; one again after a lost read
      reply or a gap (this router's own entries) is not.
    """

    def __init__(
        self,
        *,
        source: EventSource,
        held: HeldShards,
        health: RouterHealth,
        metrics: RouterMetrics,
        clock: Clock,
        page_size: int,
    ) -> None:
        self._source = source
        self._held = held
        self._health = health
        self._metrics = metrics
        self._clock = clock
        self._page_size = page_size
        self._family_of = families_by_stream(source.families)
        self._finishing: set[str] = set()  # the last page is claimed; done once it settles

    async def claim(self, stream: str) -> tuple[Sequence[Delivery], int]:
        """The next page of what earlier holders left on `stream`, with its token."""
        held = self._held.get(stream)
        if held is None:
            return [], 0
        try:
            page = await self._source.claim(
                stream, token=held.token, cursor=held.cursor, min_idle_ms=0, count=self._page_size
            )
        except PermanentError as error:
            self._health.quarantine(stream, error)
            self._finishing.discard(stream)
            return [], held.token
        if page.fenced:
            self.lost(stream)
            return [], held.token
        self._health.worked([stream])
        if page.last_delivered is not None:
            held.last_id = page.last_delivered
        if page.deliveries:
            last = max(StreamEntryId.parse(d.entry_id) for d in page.deliveries)
            if last > StreamEntryId.parse(held.last_id):
                held.last_id = str(last)
        held.cursor = page.cursor
        held.claimed += len(page.deliveries)
        if page.wrapped:
            self._finishing.add(stream)
        if not page.deliveries:
            self.finish()
        self._held.picked_up(streams_of(page.deliveries))
        return page.deliveries, held.token

    def finish(self) -> None:
        """What was claimed is settled: the shards whose last page it was are read now."""
        for stream in self._finishing:
            held = self._held.took_over(stream)
            if held is None:
                continue
            if held.again:
                held.again = False
                continue
            seconds = self._clock.monotonic() - held.acquired_s
            family = self._family_of[stream]
            self._metrics.taken_over(
                family.domain, shard_of(stream), claimed=held.claimed, seconds=seconds
            )
            if held.claimed:
                log.info(
                    "took over %s: %d entries left pending routed in %.3f s",
                    stream,
                    held.claimed,
                    seconds,
                )
        self._finishing.clear()

    def abandon(self, stream: str | None = None) -> None:
        """The claimed entries of `stream` (of every shard by default) did not settle: its
        take-over goes on from where its claim is."""
        if stream is None:
            self._finishing.clear()
        else:
            self._finishing.discard(stream)

    def lost(self, stream: str) -> None:
        """Another router holds `stream` now: forget it with what is in hand of it."""
        if self._held.lose(stream) is not None:
            log.warning("%s is held by another router now; dropping what is in hand", stream)
            family = self._family_of[stream]
            self._metrics.lease_lost(family.domain, shard_of(stream))
            self._metrics.shard_held(family.domain, shard_of(stream), None)
        self._finishing.discard(stream)
