"""In-memory adapter of `EventSource` over `InMemoryStreams`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Mapping, Sequence

from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup, WrongType
from eco_router.adapters.waited_reads import WaitedReads
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.port_values import (
    ClaimPage,
    Delivery,
    ReadBatch,
    ShardStats,
    drained_marks,
    first_ids,
    read_starts,
)
from eco_router.application.ports import EventSource
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import StreamFamily, families_by_stream, shard_of


class InMemoryEventSource(EventSource):
    """One consumer of one group; set `available = False` to simulate an unreachable server.
    `blocking=False` makes it a source whose reads cannot block on the server, as on a Redis
    Cluster: a blocking read waits for appends instead (`WaitedReads`)."""

    def __init__(
        self,
        streams: InMemoryStreams,
        *,
        families: Sequence[StreamFamily],
        group: str,
        consumer: str,
        blocking: bool = True,
    ) -> None:
        self.streams = streams
        self.available = True
        self._blocking = blocking
        self._waited = WaitedReads()
        self._waking: asyncio.Event | None = None
        self._woken = False
        self._families = tuple(families)
        self._group = group
        self._consumer = consumer
        self._family_of = families_by_stream(self._families)

    @property
    def families(self) -> tuple[StreamFamily, ...]:
        return self._families

    async def prepare(self, streams: Collection[str] | None = None) -> dict[str, PermanentError]:
        self._check()
        broken: dict[str, PermanentError] = {}
        for stream in streams or self._family_of:
            try:
                self.streams.create_group(stream, self._group)
            except WrongType as error:
                broken[stream] = PermanentError(stream, f"XGROUP CREATE: {error}")
        return broken

    async def interrupt(self) -> None:
        if not self._blocking:
            self._waited.interrupt()
        elif self._waking is not None:
            self._waking.set()
        else:
            self._woken = True

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        if not self._blocking:

            async def read_now(acks: Sequence[Delivery]) -> ReadBatch:
                return self._read_now(after, count, acks, look_behind)

            if block_ms > 0 and after:
                return await self._waited.read(after, block_ms, acks, read_now, self._wait_for_new)
            return self._waited.note(await read_now(acks))
        read = self._read_now(after, count, acks, look_behind)
        if block_ms <= 0:
            return read
        woken, self._woken = self._woken, False
        if woken or read.deliveries or read.gaps or not read.marks:
            return read
        waking = self._waking = asyncio.Event()
        try:
            waits = [
                asyncio.ensure_future(
                    self.streams.wait_for_undelivered(self._group, read.marks, block_ms / 1000)
                ),
                asyncio.ensure_future(waking.wait()),
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
        finally:
            self._waking = None
        again = self._read_now(after, count, (), look_behind)
        return dataclasses.replace(again, broken={**read.broken, **again.broken})

    def _read_now(
        self, after: Mapping[str, str], count: int, acks: Sequence[Delivery], look_behind: bool
    ) -> ReadBatch:
        self._check()
        deliveries: list[Delivery] = []
        broken: dict[str, PermanentError] = self._ack_each(acks)
        regrouped: dict[str, str] = {}
        for stream, last in after.items():
            if stream in broken:
                continue
            try:
                try:
                    taken = self.streams.read_new(self._group, self._consumer, [stream], count)
                except NoGroup:
                    # Destroyed: back at this consumer's position; deleted: from the start.
                    kept = any(i == last for i, _ in self.streams.entries(stream))
                    regrouped[stream] = last if kept else "0-0"
                    self.streams.create_group(stream, self._group, at=regrouped[stream])
                    taken = self.streams.read_new(self._group, self._consumer, [stream], count)
            except WrongType as error:
                broken.setdefault(stream, PermanentError(stream, f"XREADGROUP: {error}"))
                continue
            deliveries += [
                Delivery(self._family_of[name], name, entry_id, fields)
                for name, entries in taken.items()
                for entry_id, fields in entries
            ]
        first = first_ids(deliveries)
        reading = {s: last for s, last in after.items() if s not in broken}
        gaps = frozenset(
            s
            for s, last in reading.items()
            if look_behind
            and self.streams.gap_before(
                s, self._group, after=last, first=first.get(s), consumer=self._consumer
            )
        )
        return ReadBatch(
            deliveries,
            gaps,
            drained_marks(deliveries, reading, count),
            broken,
            regrouped,
            {} if look_behind else read_starts(self._consumer, reading, deliveries),
        )

    async def _wait_for_new(
        self, marks: Mapping[str, str], block_ms: int, acks: Sequence[Delivery]
    ) -> tuple[dict[str, str], dict[str, PermanentError]]:
        """Acks, then once a shard has an entry after its mark, or after `block_ms`: the last
        entry of each such shard, and the shards whose ack was refused for good."""
        self._check()
        refused = self._ack_each(acks)
        await self.streams.wait_for_entries(marks, block_ms / 1000)
        seen = {s: self.streams.last_id(s) for s in marks}
        return {
            s: last
            for s, last in seen.items()
            if StreamEntryId.parse(last) > StreamEntryId.parse(marks[s])
        }, refused

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        self._check()
        if not self.streams.lease_table(self._group).holds(stream, token):
            return ClaimPage([], "0-0", fenced=True)
        family = self._family_of[stream]
        try:
            position = self.streams.last_delivered(stream, self._group) if cursor == "0-0" else None
            next_cursor, claimed, deleted = self.streams.autoclaim(
                stream, self._group, self._consumer, min_idle_ms, cursor, count
            )
        except NoGroup:
            return ClaimPage([], "0-0")
        except WrongType as error:
            raise PermanentError(stream, f"claim: {error}") from error
        deliveries = [Delivery(family, stream, i, f, n) for i, f, n in claimed]
        deliveries += [Delivery(family, stream, i, None) for i in deleted]
        return ClaimPage(deliveries, next_cursor, last_delivered=position)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._check()
        refused = self._ack_each(deliveries)
        if refused:
            raise list(refused.values())[-1]

    def _ack_each(self, deliveries: Sequence[Delivery]) -> dict[str, PermanentError]:
        """Ack every delivery; the streams that refused for good."""
        refused: dict[str, PermanentError] = {}
        for delivery in deliveries:
            try:
                self.streams.ack(delivery.stream, self._group, [delivery.entry_id])
            except NoGroup:
                continue
            except WrongType as error:
                refused[delivery.stream] = PermanentError(delivery.stream, f"XACK: {error}")
        return refused

    async def shard_stats(self) -> list[ShardStats]:
        self._check()
        stats = []
        for stream, family in self._family_of.items():
            try:
                lag: int | None = self.streams.lag(stream, self._group)
                pending = len(self.streams.pending(stream, self._group))
            except (NoGroup, WrongType):
                lag, pending = None, 0
            stats.append(ShardStats(family, stream, shard_of(stream), lag, pending))
        return stats

    async def ping(self) -> None:
        self._check()

    def _check(self) -> None:
        if not self.available:
            raise TransientError("in-memory streams server marked unavailable")
