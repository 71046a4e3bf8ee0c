"""ConsumeLoop after a take-over that overlapped a read by the shard's previous holder."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.held_shards import Phase
from eco_router.application.messages import ClaimPage, Delivery, ReadBatch
from tests.unit.factories import GROUP, Harness, eventually

JOB = "job-1"


class ReadBetweenClaimPages(InMemoryEventSource):
    """Claims and reads as the server does, and counts reads; before the take-over's second
    page, the previous holder (which has not noticed it lost the shard) reads an entry that
    was just appended."""

    def __init__(self, h: Harness, previous: InMemoryEventSource) -> None:
        super().__init__(h.streams, families=[h.family], group=GROUP, consumer=h.consumer)
        self.h = h
        self.previous = previous
        self.overlapped = False
        self.reads = 0

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        if cursor != "0-0" and not self.overlapped:
            self.overlapped = True
            self.h.xadd(JOB, 6)
            await self.previous.read_new({stream: "0-0"}, count=10)
        return await super().claim(
            stream, token=token, cursor=cursor, min_idle_ms=min_idle_ms, count=count
        )

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        self.reads += 1
        return await super().read_new(
            after, count=count, acks=acks, block_ms=block_ms, look_behind=look_behind
        )


class TestTakeOverOverlappingTheLastRead:
    async def test_the_router_waits_for_appends_once_everything_is_routed(self) -> None:
        h = Harness()
        stream = h.family.stream_for(JOB)
        previous = h.consumer_source("previous-holder")
        for seq in range(1, 6):
            h.xadd(JOB, seq)
        await previous.read_new({stream: "0-0"}, count=10)  # left pending by the holder
        source = ReadBetweenClaimPages(h, previous)
        held = h.held_shards(Phase.TAKING_OVER)
        stop = asyncio.Event()
        task = asyncio.create_task(h.consume_loop(source, read_count=2, held=held).run(stop))
        try:
            await eventually(lambda: h.published_seqs(JOB) == [1, 2, 3, 4, 5, 6])
            assert h.pending() == {}
            reads = source.reads
            await asyncio.sleep(0.2)  # nothing new: each read waits 5 ms for an append
            assert source.reads - reads < 100
        finally:
            stop.set()
            async with asyncio.timeout(5.0):
                await task
