"""The contracts of the ports the operator console reads: `DeadLetterArchive` and
`ShardProgress`."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from eco_router.application.ports import (
    DeadLetterArchive,
    DeadLetterSink,
    EventSource,
    ShardProgress,
)
from eco_router.domain.rejection import RejectReason
from tests.contracts.factories import RAW_FIELDS, ContractFamilies, Fields, entry_id


class DeadLetterArchiveContract(ContractFamilies):
    """Every `DeadLetterArchive` adapter, reading what its backend's sink wrote.

    Subclasses wire a backend and implement the hooks below.
    """

    async def make_archive(self) -> DeadLetterArchive:
        raise NotImplementedError

    async def make_sink(self) -> DeadLetterSink:
        raise NotImplementedError

    async def entries(self, stream: str) -> list[tuple[str, Fields]]:
        """Every entry of `stream` as (id, fields), oldest first, exactly as stored."""
        raise NotImplementedError

    async def test_letters_read_back_oldest_first_with_origin_reason_and_raw_fields(
        self,
    ) -> None:
        sink, archive = await self.make_sink(), await self.make_archive()
        await sink.send([self.letter(entry_id=entry_id(1)), self.letter(entry_id=entry_id(2))])

        first, second = await archive.oldest(self.scan)

        assert (first.stream, first.entry_id, second.entry_id) == (
            self.scan_1,
            entry_id(1),
            entry_id(2),
        )
        assert (first.reason, first.deliveries) == (RejectReason.SEQ_NOT_INTEGER.value, 3)
        assert first.fields == RAW_FIELDS
        assert [first.dlq_id, second.dlq_id] == [
            i for i, _ in await self.entries(self.scan.dead_letter_stream)
        ]

    async def test_count_bounds_the_letters_read(self) -> None:
        sink, archive = await self.make_sink(), await self.make_archive()
        await sink.send([self.letter(entry_id=entry_id(n)) for n in range(3)])

        assert [x.entry_id for x in await archive.oldest(self.scan, count=2)] == [
            entry_id(0),
            entry_id(1),
        ]

    async def test_the_tally_counts_the_letters_and_names_the_newest(self) -> None:
        sink, archive = await self.make_sink(), await self.make_archive()
        assert (await archive.tally(self.scan)).count == 0
        assert (await archive.tally(self.scan)).newest_id is None
        await sink.send([self.letter(entry_id=entry_id(n)) for n in range(2)])

        tally = await archive.tally(self.scan)

        newest = (await self.entries(self.scan.dead_letter_stream))[-1][0]
        assert (tally.count, tally.newest_id) == (2, newest)

    async def test_a_replayed_letter_is_back_on_its_stream_byte_for_byte_and_leaves(
        self,
    ) -> None:
        sink, archive = await self.make_sink(), await self.make_archive()
        await sink.send([self.letter()])
        (letter,) = await archive.oldest(self.scan)

        (replayed,) = await archive.replay(self.scan, [letter.dlq_id])

        assert (replayed.dlq_id, replayed.stream) == (letter.dlq_id, self.scan_1)
        assert await self.entries(self.scan_1) == [(replayed.new_id, RAW_FIELDS)]
        assert await archive.oldest(self.scan) == []

    async def test_an_unknown_id_raises_lookup_error_naming_it_and_replays_nothing(
        self,
    ) -> None:
        sink, archive = await self.make_sink(), await self.make_archive()
        await sink.send([self.letter()])
        (letter,) = await archive.oldest(self.scan)

        with pytest.raises(LookupError, match="1-1"):
            await archive.replay(self.scan, [letter.dlq_id, "1-1"])

        assert await self.entries(self.scan_1) == []
        assert len(await archive.oldest(self.scan)) == 1

    async def test_replaying_all_empties_the_family_and_leaves_the_others(self) -> None:
        sink, archive = await self.make_sink(), await self.make_archive()
        chat = self.letter(family=self.chat, stream=self.chat_0, entry_id=entry_id(9))
        await sink.send([self.letter(entry_id=entry_id(n)) for n in range(2)] + [chat])

        replayed = await archive.replay(self.scan, None)

        assert len(replayed) == 2
        assert await archive.oldest(self.scan) == []
        assert len(await archive.oldest(self.chat)) == 1


class ShardProgressContract(ContractFamilies):
    """Every `ShardProgress` adapter, over streams read through a consumer group.

    Subclasses wire a backend and implement the hooks below.
    """

    async def make_progress(self) -> ShardProgress:
        raise NotImplementedError

    async def make_source(self) -> EventSource:
        """A source of the same group, to create it and read through it."""
        raise NotImplementedError

    async def append(self, stream: str, fields: Mapping[bytes, bytes]) -> str:
        raise NotImplementedError

    async def test_a_shard_without_the_group_has_unknown_counters(self) -> None:
        progress = await self.make_progress()

        counters = await progress.counters()

        assert [c.stream for c in counters] == [*self.scan.streams, *self.chat.streams]
        assert all((c.added, c.read) == (None, None) for c in counters)

    async def test_counters_grow_with_appends_and_the_groups_reads(self) -> None:
        source, progress = await self.make_source(), await self.make_progress()
        await source.prepare()
        stream = self.scan_0
        for _ in range(3):
            await self.append(stream, {b"job_id": b"job-1", b"seq": b"1"})
        await source.read_new({stream: "0-0"}, count=1)
        await self.append(stream, {b"job_id": b"job-1", b"seq": b"2"})

        counters = {c.stream: c for c in await progress.counters()}

        assert (counters[stream].added, counters[stream].read) == (4, 1)
        await source.read_new({stream: "0-0"}, count=10)
        counters = {c.stream: c for c in await progress.counters()}
        assert (counters[stream].added, counters[stream].read) == (4, 4)
