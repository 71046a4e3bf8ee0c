"""In-memory adapter of `EventSource` over `InMemoryStreams`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup
from eco_router.application.errors import TransientError
from eco_router.application.messages import (
    ClaimPage,
    Delivery,
    ShardStats,
    entries_of_jobs,
    first_entries,
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

    async def read_new(self, *, count: int, block_ms: int) -> list[Delivery]:
        self._check()
        taken = self._read_new(count)
        if not taken and block_ms > 0:
            await self.streams.wait_for_append(block_ms / 1000)
            taken = self._read_new(count)
        return [
            Delivery(self._family_of[stream], stream, entry_id, fields)
            for stream, entries in taken.items()
            for entry_id, fields in entries
        ]

    async def overtaking(
        self, deliveries: Sequence[Delivery], *, max_idle_ms: int
    ) -> set[tuple[str, str]]:
        self._check()
        first = first_entries(deliveries)
        now = self.streams.clock_ms()
        held: set[tuple[str, bytes]] = set()
        for stream, first_id in first.items():
            before = StreamEntryId.parse(first_id)
            try:
                pending = self.streams.pending(stream, self._group)
            except NoGroup:
                continue
            for entry_id, entry in pending.items():
                if (
                    entry.consumer != self._consumer
                    and now - entry.delivered_ms < max_idle_ms
                    and StreamEntryId.parse(entry_id) < before
                ):
                    job = self.streams.fields(stream, entry_id).get(b"job_id")
                    if job is not None:
                        held.add((stream, job))
        return entries_of_jobs(deliveries, held)

    async def read_own_pending(self, *, after: Mapping[str, str], count: int) -> list[Delivery]:
        self._check()
        cursors = {s: after.get(s, "0-0") for s in self._family_of}
        rows = self._retrying_nogroup(
            lambda: self.streams.read_pending(self._group, self._consumer, cursors, count)
        )
        return [
            Delivery(self._family_of[stream], stream, entry_id, fields, times)
            for stream, entries in rows.items()
            for entry_id, fields, times in entries
        ]

    async def claim_idle(
        self, stream: str, *, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        self._check()
        family = self._family_of[stream]
        next_cursor, claimed, deleted = self._retrying_nogroup(
            lambda: self.streams.autoclaim(
                stream, self._group, self._consumer, min_idle_ms, cursor, count
            )
        )
        deliveries = [Delivery(family, stream, i, f, n) for i, f, n in claimed]
        deliveries += [Delivery(family, stream, i, None) for i in deleted]
        return ClaimPage(deliveries, next_cursor)

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

    def _read_new(self, count: int) -> dict[str, list[tuple[str, dict[bytes, bytes]]]]:
        return self._retrying_nogroup(
            lambda: self.streams.read_new(self._group, self._consumer, list(self._family_of), count)
        )

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
