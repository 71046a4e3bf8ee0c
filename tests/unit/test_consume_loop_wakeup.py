"""ConsumeLoop notices a shard gained while it is busy with another one."""

from __future__ import annotations

import asyncio

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.held_shards import HeldShards
from eco_router.application.messages import ClaimPage
from tests.unit.factories import GROUP, Harness, eventually


class GainingDuringClaim(InMemoryEventSource):
    """Claims as the server does; while the first claim's reply travels, the lease keeper
    gains `stream` (it runs beside the consumer)."""

    def __init__(self, *args: object, held: HeldShards, stream: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.held = held
        self.stream = stream
        self.gained = False

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        page = await super().claim(
            stream, token=token, cursor=cursor, min_idle_ms=min_idle_ms, count=count
        )
        if not self.gained:
            self.gained = True
            self.held.gain(self.stream, 1, since_ms=0, now_s=0.0)
            await asyncio.sleep(0)
        return page


class TestShardGainedMeanwhile:
    async def test_a_shard_gained_during_a_take_over_that_ends_fenced_is_read(self) -> None:
        h = Harness()
        lost, gained = h.family.streams[0], h.family.streams[1]
        h.leases.epochs[lost] += 1  # another router took `lost` over: its claim is fenced
        held = HeldShards()
        held.gain(lost, 1, since_ms=0, now_s=0.0)
        source = GainingDuringClaim(
            h.streams,
            families=[h.family],
            group=GROUP,
            consumer=h.consumer,
            held=held,
            stream=gained,
        )
        job = next(f"job-{i}" for i in range(100) if h.family.stream_for(f"job-{i}") == gained)
        h.xadd(job, 1)
        stop = asyncio.Event()
        task = asyncio.create_task(h.consume_loop(source, held=held).run(stop))
        try:
            await eventually(lambda: h.published_seqs(job) == [1], timeout_s=2.0)
        finally:
            stop.set()
            async with asyncio.timeout(5.0):
                await task
        assert h.pending() == {}
