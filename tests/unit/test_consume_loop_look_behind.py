"""ConsumeLoop: which reads look behind every shard, and which leave the check to the apply."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.messages import Delivery, ReadBatch
from eco_router.domain.read_plan import LOOK_BEHIND_AFTER_ENTRIES, LOOK_BEHIND_EVERY_S
from tests.unit.factories import GROUP, Harness, eventually


class RecordingSource(InMemoryEventSource):
    """Notes, for each read that brought entries, whether it looked behind and how many
    entries it brought."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.reads: list[tuple[bool, int]] = []
        self.calls: list[bool] = []  # whether each read, entries or not, looked behind

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        self.calls.append(look_behind)
        batch = await super().read_new(
            after, count=count, acks=acks, block_ms=block_ms, look_behind=look_behind
        )
        if batch.deliveries:
            self.reads.append((look_behind, len(batch.deliveries)))
        return batch


class TestWhichReadsLookBehind:
    async def test_after_a_busy_read_and_once_a_second_a_read_looks_behind(
        self,
    ) -> None:
        h = Harness()
        source = RecordingSource(h.streams, families=[h.family], group=GROUP, consumer=h.consumer)
        job, busy = "job-1", LOOK_BEHIND_AFTER_ENTRIES
        stop = asyncio.Event()
        task = asyncio.create_task(h.consume_loop(source).run(stop))

        async def route(*events: tuple[str, int]) -> None:
            for job_id, seq in events:
                h.xadd(job_id, seq)
            for job_id, seq in events:
                await eventually(lambda j=job_id, s=seq: s in h.published_seqs(j))

        try:
            await eventually(h.groups_ready)
            # The first read looks behind; the ones after it, within the second, do not.
            await eventually(lambda: source.calls[:1] == [True] and False in source.calls)
            await route((job, 1))
            await route((job, 2))
            await route(*((job, seq) for seq in range(3, 3 + busy)))
            await route((job, 3 + busy))
            await route((job, 4 + busy))
            before_the_second = len(source.calls)
            h.clock.advance(int(LOOK_BEHIND_EVERY_S * 1000))
            # Nothing comes, yet a read looks behind (the one under way when the second
            # passed had decided not to; the next one does).
            await eventually(lambda: True in source.calls[before_the_second:])
            await route((job, 5 + busy))
        finally:
            stop.set()
            async with asyncio.timeout(5.0):
                await task

        assert source.reads[:5] == [
            (False, 1),
            (False, 1),
            (False, busy),
            (True, 1),  # the read before was busy
            (False, 1),
        ]
        assert h.published_seqs(job) == list(range(1, 6 + busy))
        assert h.pending() == {}
