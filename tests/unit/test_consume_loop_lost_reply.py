"""ConsumeLoop when the server read entries but its reply never arrived (a cut connection)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.errors import TransientError
from eco_router.application.messages import Delivery, ReadBatch
from tests.unit.factories import GROUP, Harness, eventually


class LosingOneReply(InMemoryEventSource):
    """Reads as the server does (the entries become pending to this consumer), then loses
    the reply of the first read that brought entries once `lose_next` is set."""

    lose_next = False

    async def read_new(
        self,
        tokens: Mapping[str, int],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        batch = await super().read_new(
            tokens, count=count, acks=acks, block_ms=block_ms, look_behind=look_behind
        )
        if self.lose_next and batch.deliveries:
            self.lose_next = False
            raise TransientError("connection reset after the server had read")
        return batch


async def seq_1_read_with_a_lost_reply_then_seq_2(
    h: Harness, source: LosingOneReply | RetryingAfterALostReply
) -> None:
    """Run the loop on `source`: job-1's seq 1 is read with a lost reply, then seq 2 comes."""
    stop = asyncio.Event()
    task = asyncio.create_task(h.consume_loop(source).run(stop))
    try:
        await eventually(h.groups_ready)
        source.lose_next = True
        h.xadd("job-1", 1)
        await eventually(lambda: not source.lose_next)
        h.xadd("job-1", 2)
        await eventually(lambda: len(h.published_seqs("job-1")) >= 2, timeout_s=2.0)
    finally:
        stop.set()
        async with asyncio.timeout(5.0):
            await task


class TestLostReadReply:
    async def test_entries_read_with_a_lost_reply_are_routed_before_newer_ones(self) -> None:
        h = Harness()
        source = LosingOneReply(h.streams, families=[h.family], group=GROUP, consumer=h.consumer)
        await seq_1_read_with_a_lost_reply_then_seq_2(h, source)

        assert h.published_seqs("job-1") == [1, 2]
        assert h.pending() == {}


class RetryingAfterALostReply(InMemoryEventSource):
    """Like a client that retries a read whose reply was lost: the entries the first attempt
    took are pending to this consumer, and the caller gets only the second attempt's."""

    lose_next = False

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        first = await super().read_new(
            after, count=count, acks=acks, block_ms=block_ms, look_behind=look_behind
        )
        if not (self.lose_next and first.deliveries):
            return first
        # The reply of the attempt that took entries is lost; the retry reads on.
        self.lose_next = False
        return await super().read_new(
            after, count=count, acks=acks, block_ms=block_ms, look_behind=look_behind
        )


class TestRetriedRead:
    async def test_what_the_lost_attempt_took_is_routed_before_what_the_retry_read(self) -> None:
        h = Harness()
        source = RetryingAfterALostReply(
            h.streams, families=[h.family], group=GROUP, consumer=h.consumer
        )
        await seq_1_read_with_a_lost_reply_then_seq_2(h, source)

        assert h.published_seqs("job-1") == [1, 2]
        assert h.pending() == {}
