"""The `EventSource` contract: fenced consumer-group reading, waiting, claiming, recovery."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.port_values import Delivery, ShardStats
from eco_router.application.ports import EventSource
from tests.contracts.factories import GROUP, ContractFamilies

IDLE_MS = 50


def fields_of(n: int, job_id: str = "job-1") -> dict[bytes, bytes]:
    """The fields of a producer's entry, distinct for every `n`."""
    return {b"job_id": job_id.encode(), b"seq": str(n).encode(), b"stage": b"scanning"}


def ids(deliveries: list[Delivery]) -> list[str]:
    return [d.entry_id for d in deliveries]


def stats_of(stats: list[ShardStats], stream: str) -> ShardStats:
    return next(s for s in stats if s.stream == stream)


class EventSourceContract(ContractFamilies):
    """Every `EventSource` adapter reads the class's `families` (`scan` with 2 shards, `chat`
    with 1) as group `GROUP`.

    Subclasses wire a backend and implement the hooks below.
    """

    @property
    def tokens(self) -> dict[str, int]:
        """Every shard's fencing epoch as each test starts: a source claiming with these holds
        them all."""
        return {self.scan_0: 1, self.scan_1: 1, self.chat_0: 1}

    @property
    def from_start(self) -> dict[str, str]:
        """Reading every shard from its beginning."""
        return dict.fromkeys(self.tokens, "0-0")

    async def make_source(self, *, consumer: str, group: str = GROUP) -> EventSource:
        """A source over `families` on the shared backend, not prepared yet."""
        raise NotImplementedError

    async def append(self, stream: str, fields: Mapping[bytes, bytes]) -> str:
        """XADD as a producer would; returns the new entry id."""
        raise NotImplementedError

    async def delete_entry(self, stream: str, entry_id: str) -> None:
        """XDEL, as trimming does to entries that may still be pending."""
        raise NotImplementedError

    async def delete_stream(self, stream: str) -> None:
        """DEL the stream key, its groups with it."""
        raise NotImplementedError

    async def break_shard(self, stream: str) -> None:
        """Replace the stream key by a string, as `DEL` then `SET key x` would."""
        raise NotImplementedError

    async def destroy_group(self, stream: str) -> None:
        """XGROUP DESTROY the group on `stream`, its entries kept."""
        raise NotImplementedError

    async def let_time_pass(self, ms: int) -> None:
        """Make at least `ms` milliseconds pass for the backend's idle times."""
        raise NotImplementedError

    async def cut_server(self, source: EventSource) -> None:
        """Make the streams server unreachable for `source`."""
        raise NotImplementedError

    async def set_epoch(self, stream: str, token: int) -> None:
        """Set the shard's fencing epoch, as the lease store does when a router takes it."""
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    async def _tokens(self, _backend: None) -> None:
        for stream, token in self.tokens.items():
            await self.set_epoch(stream, token)

    async def prepared_source(self, consumer: str = "consumer-a") -> EventSource:
        source = await self.make_source(consumer=consumer)
        await source.prepare()
        return source

    async def append_many(self, stream: str, count: int) -> list[str]:
        return [await self.append(stream, fields_of(n)) for n in range(1, count + 1)]

    async def read_all(self, source: EventSource, count: int = 100) -> list[Delivery]:
        return (await source.read_new(self.from_start, count=count)).deliveries

    async def claim_all(
        self, source: EventSource, stream: str, *, min_idle_ms: int = 0, count: int = 100
    ) -> list[Delivery]:
        """One claim page of `stream` under its token (a take-over when `min_idle_ms` is 0)."""
        page = await source.claim(
            stream, token=self.tokens[stream], cursor="0-0", min_idle_ms=min_idle_ms, count=count
        )
        return page.deliveries

    # prepare

    async def test_prepare_creates_the_group_on_every_shard_of_every_family(self) -> None:
        source = await self.make_source(consumer="consumer-a")
        before = await source.shard_stats()

        await source.prepare()

        after = await source.shard_stats()
        assert [(s.stream, s.lag) for s in before] == [
            (self.scan_0, None),
            (self.scan_1, None),
            (self.chat_0, None),
        ]
        assert [(s.stream, s.lag, s.pending) for s in after] == [
            (self.scan_0, 0, 0),
            (self.scan_1, 0, 0),
            (self.chat_0, 0, 0),
        ]
        assert [(s.family, s.shard) for s in after] == [
            (self.scan, 0),
            (self.scan, 1),
            (self.chat, 0),
        ]

    async def test_prepare_starts_the_group_at_the_beginning_of_an_existing_stream(self) -> None:
        written = await self.append_many(self.scan_0, 2)
        source = await self.prepared_source()

        assert ids(await self.read_all(source)) == written

    async def test_prepare_again_keeps_the_group_position_and_pending_entries(self) -> None:
        source = await self.prepared_source()
        [first] = await self.append_many(self.scan_0, 1)
        await self.read_all(source)

        await source.prepare()
        await source.prepare()

        assert await self.read_all(source) == []
        assert stats_of(await source.shard_stats(), self.scan_0).pending == 1
        assert ids(await self.claim_all(source, self.scan_0)) == [first]

    # read_new

    async def test_read_new_returns_every_new_entry_in_id_order_with_its_stream(self) -> None:
        source = await self.prepared_source()
        scan_ids = await self.append_many(self.scan_0, 3)
        chat_id = await self.append(self.chat_0, fields_of(9, "chat-job"))

        deliveries = await self.read_all(source)

        assert sorted((d.stream, d.entry_id) for d in deliveries) == sorted(
            [(self.scan_0, i) for i in scan_ids] + [(self.chat_0, chat_id)]
        )
        assert ids([d for d in deliveries if d.stream == self.scan_0]) == scan_ids
        # Ids are unique per stream only.
        by_key = {(d.stream, d.entry_id): d for d in deliveries}
        assert by_key[(self.chat_0, chat_id)].family == self.chat
        assert by_key[(self.chat_0, chat_id)].fields == fields_of(9, "chat-job")
        assert [by_key[(self.scan_0, i)].family for i in scan_ids] == [self.scan] * 3
        assert [by_key[(self.scan_0, i)].fields for i in scan_ids] == [
            fields_of(n) for n in (1, 2, 3)
        ]
        assert {d.delivery_count for d in deliveries} == {1}

    async def test_an_entry_is_delivered_once_per_group(self) -> None:
        first = await self.prepared_source("consumer-a")
        second = await self.prepared_source("consumer-b")
        written = await self.append_many(self.scan_1, 2)
        other_group = await self.make_source(consumer="consumer-a", group="audit")
        await other_group.prepare()

        assert ids(await self.read_all(first)) == written
        assert await self.read_all(first) == []
        assert await self.read_all(second) == []
        assert ids(await self.read_all(other_group)) == written

    async def test_read_new_takes_at_most_count_entries_per_shard(self) -> None:
        source = await self.prepared_source()
        written = await self.append_many(self.scan_0, 3)

        assert ids(await self.read_all(source, count=2)) == written[:2]
        assert ids(await self.read_all(source, count=2)) == written[2:]

    async def test_read_new_reads_only_the_shards_given(self) -> None:
        source = await self.prepared_source()
        [scan] = await self.append_many(self.scan_0, 1)
        await self.append(self.chat_0, fields_of(1, "chat-job"))

        batch = await source.read_new({self.scan_0: "0-0"}, count=10)

        assert ids(batch.deliveries) == [scan]
        assert stats_of(await source.shard_stats(), self.chat_0).lag == 1

    async def test_read_new_returns_at_once_with_marks_when_nothing_is_new(self) -> None:
        source = await self.prepared_source()
        [last] = await self.append_many(self.scan_0, 1)
        await self.read_all(source)

        async with asyncio.timeout(5):
            batch = await source.read_new({**self.from_start, self.scan_0: last}, count=10)

        assert batch.deliveries == []
        assert batch.gaps == frozenset()
        assert batch.marks == {self.scan_0: last, self.scan_1: "0-0", self.chat_0: "0-0"}

    async def test_a_read_that_drains_every_shard_gives_marks_one_that_does_not_none(
        self,
    ) -> None:
        source = await self.prepared_source()
        written = await self.append_many(self.scan_0, 3)

        partial = await source.read_new(self.from_start, count=2)
        rest = await source.read_new({**self.from_start, self.scan_0: written[1]}, count=2)

        assert (ids(partial.deliveries), partial.marks) == (written[:2], {})
        assert ids(rest.deliveries) == written[2:]
        assert rest.marks == {self.scan_0: written[2], self.scan_1: "0-0", self.chat_0: "0-0"}

    async def test_entries_another_consumer_took_after_the_last_read_are_a_gap(self) -> None:
        holder = await self.prepared_source("consumer-a")
        stale = await self.prepared_source("consumer-b")
        [first] = await self.append_many(self.scan_0, 1)
        await self.read_all(holder)
        await self.append(self.scan_0, fields_of(2))
        await self.read_all(stale)  # a router that lost the shard reads on
        [chat] = await self.append_many(self.chat_0, 1)
        third = await self.append(self.scan_0, fields_of(3))

        batch = await holder.read_new({self.scan_0: first, self.chat_0: "0-0"}, count=10)

        assert batch.gaps == {self.scan_0}
        assert ids(batch.deliveries) == [third, chat] or ids(batch.deliveries) == [chat, third]

    async def test_entries_an_earlier_read_took_whose_reply_was_lost_are_a_gap(self) -> None:
        source = await self.prepared_source()
        [first] = await self.append_many(self.scan_0, 1)
        await self.read_all(source)
        await self.append(self.scan_0, fields_of(2))
        await self.read_all(source)  # its reply never arrived; the client read again
        third = await self.append(self.scan_0, fields_of(3))

        batch = await source.read_new({self.scan_0: first}, count=10)

        assert batch.gaps == {self.scan_0}
        assert ids(batch.deliveries) == [third]

    async def test_no_gap_when_only_this_consumer_holds_entries_after_its_last(self) -> None:
        holder = await self.prepared_source("consumer-a")
        other = await self.prepared_source("consumer-b")
        [older] = await self.append_many(self.scan_0, 1)
        await self.read_all(other)  # before the holder's position: not a gap
        written = [await self.append(self.scan_0, fields_of(n)) for n in (2, 3)]
        await holder.read_new({self.scan_0: older}, count=1)

        batch = await holder.read_new({self.scan_0: written[0]}, count=10)

        assert batch.gaps == frozenset()
        assert ids(batch.deliveries) == written[1:]

    async def test_read_new_recovers_from_a_deleted_stream_by_recreating_the_group(
        self,
    ) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 2)
        await self.read_all(source)
        await self.delete_stream(self.scan_0)
        written = await self.append(self.scan_0, fields_of(3))

        deliveries = await self.read_all(source)

        assert [(d.stream, d.entry_id, d.delivery_count) for d in deliveries] == [
            (self.scan_0, written, 1)
        ]
        assert stats_of(await source.shard_stats(), self.scan_0).pending == 1

    async def test_read_new_on_a_deleted_and_empty_stream_returns_nothing(self) -> None:
        source = await self.prepared_source()
        await self.delete_stream(self.chat_0)

        assert await self.read_all(source) == []
        assert stats_of(await source.shard_stats(), self.chat_0).lag == 0

    async def test_a_destroyed_group_comes_back_after_the_reader_s_position(self) -> None:
        source = await self.prepared_source()
        read = await self.append_many(self.scan_0, 2)
        await self.read_all(source)
        await source.ack(await self.claim_all(source, self.scan_0))
        await self.destroy_group(self.scan_0)
        written = await self.append(self.scan_0, fields_of(3))

        batch = await source.read_new({**self.from_start, self.scan_0: read[-1]}, count=100)

        assert [(d.stream, d.entry_id) for d in batch.deliveries] == [(self.scan_0, written)]
        assert batch.regrouped == {self.scan_0: read[-1]}

    async def test_a_shard_of_the_wrong_type_is_reported_broken_and_the_others_read(
        self,
    ) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 1)
        chat = await self.append_many(self.chat_0, 1)
        await self.break_shard(self.scan_0)

        batch = await source.read_new(self.from_start, count=100)

        assert [(d.stream, d.entry_id) for d in batch.deliveries] == [(self.chat_0, chat[0])]
        assert list(batch.broken) == [self.scan_0]
        assert batch.broken[self.scan_0].key == self.scan_0
        assert "WRONGTYPE" in batch.broken[self.scan_0].cause

    async def test_prepare_reports_a_shard_of_the_wrong_type_and_creates_the_others(
        self,
    ) -> None:
        source = await self.make_source(consumer="consumer-a")
        await self.break_shard(self.scan_1)

        broken = await source.prepare()

        assert list(broken) == [self.scan_1]
        stats = await source.shard_stats()
        assert [(s.stream, s.lag) for s in stats] == [
            (self.scan_0, 0),
            (self.scan_1, None),
            (self.chat_0, 0),
        ]

    async def test_a_claim_or_ack_on_a_shard_of_the_wrong_type_names_it(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 1)
        deliveries = await self.read_all(source)
        await self.break_shard(self.scan_0)

        with pytest.raises(PermanentError) as claimed:
            await self.claim_all(source, self.scan_0)
        with pytest.raises(PermanentError) as acked:
            await source.ack(deliveries)

        assert claimed.value.key == self.scan_0
        assert acked.value.key == self.scan_0

    # pending list, ack

    async def test_entries_read_but_not_acked_are_pending(self) -> None:
        source = await self.prepared_source()
        written = await self.append_many(self.scan_0, 2)
        await self.read_all(source)

        assert stats_of(await source.shard_stats(), self.scan_0).pending == 2
        assert ids(await self.claim_all(source, self.scan_0)) == written

    async def test_ack_removes_entries_from_the_pending_list(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 3)
        await self.append(self.chat_0, fields_of(1, "chat-job"))
        deliveries = await self.read_all(source)
        kept = next(d for d in deliveries if d.stream == self.scan_0)

        await source.ack([d for d in deliveries if d is not kept])

        stats = await source.shard_stats()
        assert [(s.stream, s.pending) for s in stats] == [
            (self.scan_0, 1),
            (self.scan_1, 0),
            (self.chat_0, 0),
        ]
        assert ids(await self.claim_all(source, self.scan_0)) == [kept.entry_id]

    async def test_ack_of_nothing_and_of_a_deleted_stream_is_harmless(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_1, 1)
        deliveries = await self.read_all(source)
        await self.delete_stream(self.scan_1)

        await source.ack([])
        await source.ack(deliveries)

        assert await self.claim_all(source, self.scan_1) == []

    # blocking reads

    async def test_a_blocking_read_returns_at_once_what_is_there(self) -> None:
        source = await self.prepared_source()
        written = await self.append_many(self.scan_0, 2)

        async with asyncio.timeout(2):
            batch = await source.read_new(self.from_start, count=100, block_ms=5000)

        assert ids(batch.deliveries) == written
        assert batch.marks

    async def test_a_blocking_read_returns_the_first_entry_appended_while_it_waits(
        self,
    ) -> None:
        source = await self.prepared_source()
        after = (await source.read_new(self.from_start, count=100)).marks
        reading = asyncio.ensure_future(source.read_new(after, count=100, block_ms=5000))
        await asyncio.sleep(0.1)
        assert not reading.done()

        written = await self.append(self.scan_1, fields_of(1))

        async with asyncio.timeout(5):
            batch = await reading
        assert [(d.stream, d.entry_id) for d in batch.deliveries] == [(self.scan_1, written)]
        assert batch.marks[self.scan_1] == written

    async def test_a_blocking_read_waits_past_entries_another_consumer_routed(self) -> None:
        source = await self.prepared_source()
        other = await self.prepared_source("consumer-b")
        await self.append_many(self.scan_0, 2)
        taken = await other.read_new(self.from_start, count=100)
        await other.ack(taken.deliveries)
        reading = asyncio.ensure_future(source.read_new(self.from_start, count=100, block_ms=5000))
        await asyncio.sleep(0.1)
        if reading.done():
            # A source that waits for appends saw the other consumer's entries once: the
            # next read waits past them.
            assert (await reading).deliveries == []
            reading = asyncio.ensure_future(
                source.read_new(self.from_start, count=100, block_ms=5000)
            )
            await asyncio.sleep(0.1)
        assert not reading.done()

        written = await self.append(self.scan_1, fields_of(3))

        async with asyncio.timeout(5):
            assert ids((await reading).deliveries) == [written]

    async def test_a_blocking_read_returns_nothing_after_its_block(self) -> None:
        source = await self.prepared_source()
        after = (await source.read_new(self.from_start, count=100)).marks

        async with asyncio.timeout(5):
            batch = await source.read_new(after, count=100, block_ms=50)

        assert batch.deliveries == []
        assert batch.marks == after

    async def test_interrupt_wakes_a_blocked_read_which_loses_nothing(self) -> None:
        source = await self.prepared_source()
        after = (await source.read_new(self.from_start, count=100)).marks
        reading = asyncio.ensure_future(source.read_new(after, count=100, block_ms=30_000))
        await asyncio.sleep(0.1)

        async with asyncio.timeout(5):
            await source.interrupt()
            batch = await reading

        assert batch.deliveries == []
        written = await self.append(self.scan_0, fields_of(1))
        later = await source.read_new(after, count=100)
        assert ids(later.deliveries) == [written]

    async def test_interrupt_just_as_the_read_starts_still_wakes_it(self) -> None:
        source = await self.prepared_source()
        after = (await source.read_new(self.from_start, count=100)).marks
        reading = asyncio.ensure_future(source.read_new(after, count=100, block_ms=30_000))
        await asyncio.sleep(0)  # the read has begun, its command may not have reached the server

        async with asyncio.timeout(5):
            await source.interrupt()
            batch = await reading

        assert batch.deliveries == []

    async def test_an_interrupt_with_no_read_in_flight_makes_the_next_one_not_block(
        self,
    ) -> None:
        source = await self.prepared_source()
        after = (await source.read_new(self.from_start, count=100)).marks

        await source.interrupt()

        async with asyncio.timeout(5):
            assert (await source.read_new(after, count=100, block_ms=30_000)).deliveries == []

    async def test_a_blocking_read_acks_what_it_is_given(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 2)
        read = await source.read_new(self.from_start, count=100)

        async with asyncio.timeout(5):
            await source.read_new(read.marks, count=100, acks=read.deliveries, block_ms=50)

        assert stats_of(await source.shard_stats(), self.scan_0).pending == 0

    async def test_a_blocking_read_reports_a_broken_shard_and_reads_the_others(self) -> None:
        source = await self.prepared_source()
        await self.break_shard(self.scan_0)
        chat = await self.append(self.chat_0, fields_of(1, "chat-job"))

        async with asyncio.timeout(5):
            batch = await source.read_new(self.from_start, count=100, block_ms=5000)

        assert ids(batch.deliveries) == [chat]
        assert list(batch.broken) == [self.scan_0]

    async def test_a_blocking_read_brings_a_destroyed_group_back(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 2)
        read = ids(await self.read_all(source))
        await self.destroy_group(self.scan_0)
        written = await self.append(self.scan_0, fields_of(3))

        async with asyncio.timeout(5):
            batch = await source.read_new(
                {**self.from_start, self.scan_0: read[-1]}, count=100, block_ms=5000
            )

        assert [(d.stream, d.entry_id) for d in batch.deliveries] == [(self.scan_0, written)]
        assert batch.regrouped == {self.scan_0: read[-1]}

    async def test_a_blocking_read_reports_a_gap(self) -> None:
        source = await self.prepared_source()
        other = await self.prepared_source("consumer-b")
        written = await self.append_many(self.scan_0, 1)
        await other.read_new({self.scan_0: "0-0"}, count=100)

        async with asyncio.timeout(5):
            batch = await source.read_new({self.scan_0: "0-0"}, count=100, block_ms=50)

        assert batch.deliveries == []
        assert batch.gaps == {self.scan_0}
        assert written

    async def test_a_blocking_read_on_an_unreachable_server_raises_a_transient_error(
        self,
    ) -> None:
        source = await self.prepared_source()
        await self.cut_server(source)

        with pytest.raises(TransientError):
            async with asyncio.timeout(20):
                await source.read_new(self.from_start, count=100, block_ms=50)

    # acks carried by a read or a wait

    async def test_read_new_acks_what_it_is_given_before_it_reads(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 2)
        await self.append(self.chat_0, fields_of(1, "chat-job"))
        routed = await self.read_all(source)
        later = await self.append(self.scan_1, fields_of(3))

        batch = await source.read_new(self.from_start, count=100, acks=routed)

        assert ids(batch.deliveries) == [later]
        assert [(s.stream, s.pending) for s in await source.shard_stats()] == [
            (self.scan_0, 0),
            (self.scan_1, 1),
            (self.chat_0, 0),
        ]

    async def test_read_new_of_no_shard_still_acks(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 1)
        routed = await self.read_all(source)

        await source.read_new({}, count=100, acks=routed)

        assert stats_of(await source.shard_stats(), self.scan_0).pending == 0

    async def test_an_ack_refused_for_good_reports_its_shard_broken_and_the_rest_read(
        self,
    ) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 1)
        routed = await self.read_all(source)
        await self.break_shard(self.scan_0)
        chat = await self.append(self.chat_0, fields_of(1, "chat-job"))

        batch = await source.read_new(
            {self.scan_1: "0-0", self.chat_0: "0-0"}, count=100, acks=routed
        )

        assert ids(batch.deliveries) == [chat]
        assert list(batch.broken) == [self.scan_0]
        assert batch.broken[self.scan_0].key == self.scan_0

    async def test_a_blocking_read_after_a_draining_one_acks_before_it_waits(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 2)
        read = await source.read_new(self.from_start, count=100)
        blocking = asyncio.ensure_future(
            source.read_new(read.marks, count=100, acks=read.deliveries, block_ms=5000)
        )
        try:
            for _ in range(500):
                if not stats_of(await source.shard_stats(), self.scan_0).pending:
                    break
                await asyncio.sleep(0.01)
            assert stats_of(await source.shard_stats(), self.scan_0).pending == 0
            assert not blocking.done()
        finally:
            await source.interrupt()
            async with asyncio.timeout(5):
                await blocking

    async def test_a_blocking_read_reports_a_shard_that_refuses_its_ack_for_good(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 1)
        read = await source.read_new(self.from_start, count=100)
        await self.break_shard(self.scan_0)
        after = {self.chat_0: read.marks[self.chat_0]}

        async with asyncio.timeout(5):
            batch = await source.read_new(after, count=100, acks=read.deliveries, block_ms=50)

        assert list(batch.broken) == [self.scan_0]

    # claim

    async def test_a_take_over_claims_every_pending_entry_with_its_delivery_count(
        self,
    ) -> None:
        crashed = await self.prepared_source("consumer-a")
        heir = await self.prepared_source("consumer-b")
        written = await self.append_many(self.scan_1, 2)
        await self.read_all(crashed)

        again = await self.claim_all(heir, self.scan_1)
        third = await self.claim_all(heir, self.scan_1)

        assert [(d.entry_id, d.delivery_count) for d in again] == [(i, 2) for i in written]
        assert [(d.entry_id, d.delivery_count) for d in third] == [(i, 3) for i in written]
        assert [d.fields for d in third] == [fields_of(1), fields_of(2)]
        assert {(d.family, d.stream) for d in third} == {(self.scan, self.scan_1)}
        assert await self.claim_all(crashed, self.scan_0) == []

    async def test_claim_takes_idle_entries_from_another_consumer(self) -> None:
        crashed = await self.prepared_source("consumer-a")
        rescuer = await self.prepared_source("consumer-b")
        written = await self.append_many(self.scan_1, 2)
        await self.read_all(crashed)
        await self.let_time_pass(IDLE_MS + 20)

        page = await rescuer.claim(
            self.scan_1, token=1, cursor="0-0", min_idle_ms=IDLE_MS, count=10
        )

        assert page.wrapped
        assert not page.fenced
        assert page.last_delivered == written[-1]
        assert [(d.entry_id, d.delivery_count) for d in page.deliveries] == [
            (i, 2) for i in written
        ]
        assert [d.fields for d in page.deliveries] == [fields_of(1), fields_of(2)]
        assert {(d.family, d.stream) for d in page.deliveries} == {(self.scan, self.scan_1)}

    async def test_claim_leaves_entries_that_are_not_idle_long_enough(self) -> None:
        busy = await self.prepared_source("consumer-a")
        rescuer = await self.prepared_source("consumer-b")
        written = await self.append_many(self.scan_0, 2)
        await self.read_all(busy)

        page = await rescuer.claim(self.scan_0, token=1, cursor="0-0", min_idle_ms=60_000, count=10)

        assert page.deliveries == []
        assert page.wrapped
        assert ids(await self.claim_all(busy, self.scan_0)) == written

    async def test_claim_under_a_token_that_moved_on_is_fenced_and_takes_nothing(
        self,
    ) -> None:
        holder = await self.prepared_source("consumer-a")
        stale = await self.prepared_source("consumer-b")
        written = await self.append_many(self.scan_0, 2)
        await self.read_all(holder)
        await self.set_epoch(self.scan_0, 2)

        page = await stale.claim(self.scan_0, token=1, cursor="0-0", min_idle_ms=0, count=10)

        assert page.fenced
        assert page.deliveries == []
        new_holder = await holder.claim(self.scan_0, token=2, cursor="0-0", min_idle_ms=0, count=10)
        assert [(d.entry_id, d.delivery_count) for d in new_holder.deliveries] == [
            (i, 2) for i in written
        ]

    async def test_claim_returns_entries_deleted_while_pending_without_fields(
        self,
    ) -> None:
        crashed = await self.prepared_source("consumer-a")
        rescuer = await self.prepared_source("consumer-b")
        kept, deleted = await self.append_many(self.scan_0, 2)
        await self.read_all(crashed)
        await self.delete_entry(self.scan_0, deleted)

        deliveries = await self.claim_all(rescuer, self.scan_0)

        by_id = {d.entry_id: d for d in deliveries}
        assert sorted(by_id) == sorted([kept, deleted])
        assert by_id[deleted].fields is None
        assert by_id[deleted].stream == self.scan_0
        assert by_id[deleted].family == self.scan
        assert by_id[kept].fields == fields_of(1)
        # The deleted entry leaves the pending list: only the claimed one is left.
        assert stats_of(await rescuer.shard_stats(), self.scan_0).pending == 1

    async def test_claim_pages_with_its_cursor_until_it_wraps(self) -> None:
        crashed = await self.prepared_source("consumer-a")
        rescuer = await self.prepared_source("consumer-b")
        written = await self.append_many(self.scan_0, 5)
        await self.read_all(crashed)

        pages, cursor = [], "0-0"
        while True:
            page = await rescuer.claim(self.scan_0, token=1, cursor=cursor, min_idle_ms=0, count=2)
            pages.append(page)
            if page.wrapped or len(pages) > 10:
                break
            cursor = page.cursor

        assert [ids(p.deliveries) for p in pages] == [written[:2], written[2:4], written[4:]]
        assert [p.cursor for p in pages] == [written[2], written[4], "0-0"]

    async def test_claim_on_a_deleted_stream_returns_an_empty_wrapped_page(self) -> None:
        source = await self.prepared_source()
        await self.delete_stream(self.scan_0)

        page = await source.claim(self.scan_0, token=1, cursor="0-0", min_idle_ms=0, count=10)

        assert page.deliveries == []
        assert page.wrapped

    # shard_stats

    async def test_shard_stats_show_lag_and_pending_per_shard(self) -> None:
        source = await self.prepared_source()
        await self.append_many(self.scan_0, 3)
        await self.append_many(self.chat_0, 1)
        await self.read_all(source, count=1)

        stats = await source.shard_stats()

        assert [(s.family, s.stream, s.shard, s.lag, s.pending) for s in stats] == [
            (self.scan, self.scan_0, 0, 2, 1),
            (self.scan, self.scan_1, 1, 0, 0),
            (self.chat, self.chat_0, 0, 0, 1),
        ]

    # availability

    async def test_ping_answers_while_the_server_is_up(self) -> None:
        source = await self.prepared_source()

        await source.ping()

    async def test_an_unreachable_server_raises_transient_errors(self) -> None:
        source = await self.prepared_source()
        await self.cut_server(source)

        with pytest.raises(TransientError):
            await source.ping()
        with pytest.raises(TransientError):
            await source.read_new(self.from_start, count=10)
        with pytest.raises(TransientError):
            await source.claim(self.scan_0, token=1, cursor="0-0", min_idle_ms=0, count=10)
