"""ConsumeLoop does not spin on a shard whose lease it lost without hearing of it yet: the
wait for appends returns at once (another router read entries after this one's position),
the read finds none of them; the loop asks the lease keeper to check now, and waits."""

from __future__ import annotations

import asyncio

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.messages import ReadBatch
from tests.unit.factories import GROUP, Harness


class CountingReads(InMemoryEventSource):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.empty_reads = 0

    async def read_new(self, after: dict[str, str], *, count: int) -> ReadBatch:  # type: ignore[override]
        batch = await super().read_new(after, count=count)
        if not batch.deliveries and not batch.gaps:
            self.empty_reads += 1
        return batch


class TestLeaseLostUnawares:
    async def test_the_loop_doubts_its_leases_instead_of_reading_over_and_over(self) -> None:
        h = Harness()
        shard = h.family.streams[0]
        job = next(f"job-{i}" for i in range(100) if h.family.stream_for(f"job-{i}") == shard)
        source = CountingReads(h.streams, families=[h.family], group=GROUP, consumer=h.consumer)
        held = h.held_shards()
        loop = h.consume_loop(source, held=held)
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        try:
            await asyncio.sleep(0.05)
            # Another router, holding the shard now, reads and routes what is appended.
            other = h.consumer_source("router-2")
            h.xadd(job, 1)
            taken = await other.read_new({shard: "0-0"}, count=10)
            await other.ack(taken.deliveries)
            reads_before = source.empty_reads
            await asyncio.sleep(0.3)
        finally:
            stop.set()
            async with asyncio.timeout(5.0):
                await task

        assert held.doubted.is_set()
        # A spinning loop reads thousands of times in 0.3 s; a doubting one a few.
        assert source.empty_reads - reads_before <= 6
