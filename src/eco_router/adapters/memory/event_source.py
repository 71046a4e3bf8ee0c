"""In-memory adapter of `EventSource` over `InMemoryStreams`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup
from eco_router.application.errors import TransientError
from eco_router.application.messages import (
    ClaimPage,
    Delivery,
    ReadBatch,
    ShardStats,
    drained_marks,
    first_ids,
)
from eco_router.application.ports import EventSource
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import StreamFamily, shard_of

T = TypeVar("T")


class InMemoryEventSource(EventSource):
    """One consumer of one group; set `available = False` to simulate an unreachable server."""

    def __init__(
        self,
        streams: InMemoryStreams,
        *,
        families: Sequence[StreamFamily],
        group: str,
        consumer: str,
    ) -> None:
        self.streams = streams
        self.available = True
        self._families = tuple(families)
        self._group = group
        self._consumer = consumer
        self._family_of = {s: f for f in self._families for s in f.streams}

    @property
    def families(self) -> tuple[StreamFamily, ...]:
        return self._families

    async def prepare(self) -> None:
        self._check()
        for stream in self._family_of:
            self.streams.create_group(stream, self._group)

    async def read_new(self, after: Mapping[str, str], *, count: int) -> ReadBatch:
        self._check()
        taken = self._retrying_nogroup(
            lambda: self.streams.read_new(self._group, self._consumer, list(after), count)
        )
        deliveries = [
            Delivery(self._family_of[stream], stream, entry_id, fields)
            for stream, entries in taken.items()
            for entry_id, fields in entries
        ]
        first = first_ids(deliveries)
        gaps = frozenset(s for s, last in after.items() if self._gap(s, last, first.get(s)))
        return ReadBatch(deliveries, gaps, drained_marks(deliveries, after, count))

    def _gap(self, stream: str, last: str, first_read: str | None) -> bool:
        """Whether the first entry pending after `last` is not this read's first one."""
        floor = StreamEntryId.parse(last)
        pending = self.streams.pending(stream, self._group)
        later = [i for i in pending if StreamEntryId.parse(i) > floor]
        if not later:
            return False
        lowest = min(later, key=StreamEntryId.parse)
        return pending[lowest].consumer != self._consumer or lowest != first_read

    async def wait_for_new(self, marks: Mapping[str, str], *, block_ms: int) -> None:
        self._check()
        await self.streams.wait_for_entries(marks, block_ms / 1000)

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        self._check()
        if not self.streams.lease_table(self._group).holds(stream, token):
            return ClaimPage([], "0-0", fenced=True)
        family = self._family_of[stream]
        position = self._retrying_nogroup(
            lambda: self.streams.last_delivered(stream, self._group) if cursor == "0-0" else None
        )
        next_cursor, claimed, deleted = self._retrying_nogroup(
            lambda: self.streams.autoclaim(
                stream, self._group, self._consumer, min_idle_ms, cursor, count
            )
        )
        deliveries = [Delivery(family, stream, i, f, n) for i, f, n in claimed]
        deliveries += [Delivery(family, stream, i, None) for i in deleted]
        return ClaimPage(deliveries, next_cursor, last_delivered=position)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._check()
        for delivery in deliveries:
            try:
                self.streams.ack(delivery.stream, self._group, [delivery.entry_id])
            except NoGroup:
                continue

    async def shard_stats(self) -> list[ShardStats]:
        self._check()
        stats = []
        for stream, family in self._family_of.items():
            try:
                lag: int | None = self.streams.lag(stream, self._group)
                pending = len(self.streams.pending(stream, self._group))
            except NoGroup:
                lag, pending = None, 0
            stats.append(ShardStats(family, stream, shard_of(stream), lag, pending))
        return stats

    async def ping(self) -> None:
        self._check()

    def _retrying_nogroup(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except NoGroup:
            for stream in self._family_of:
                self.streams.create_group(stream, self._group)
            return call()

    def _check(self) -> None:
        if not self.available:
            raise TransientError("in-memory streams server marked unavailable")
