"""A shard the server refuses for good is quarantined; the other shards go on routing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from eco_router.application.consume_loop import ConsumeLoop
from tests.unit.factories import Harness, eventually


@asynccontextmanager
async def running(loop: ConsumeLoop) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        yield
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await task


def jobs_on_every_shard(h: Harness, stem: str) -> dict[str, str]:
    found: dict[str, str] = {}
    n = 0
    while len(found) < h.family.shards:
        job = f"{stem}-{n}"
        found.setdefault(h.family.stream_for(job), job)
        n += 1
    return found


class TestAShardOfTheWrongType:
    async def test_at_startup_it_is_quarantined_and_the_others_route(self) -> None:
        h = Harness()
        jobs = jobs_on_every_shard(h, "job")
        broken = h.family.streams[2]
        h.streams.break_shard(broken)
        for stream, job in jobs.items():
            if stream != broken:
                h.xadd(job, 1)
        loop = h.consume_loop()

        async with running(loop):
            await eventually(
                lambda: all(h.published_seqs(j) == [1] for s, j in jobs.items() if s != broken)
            )

        assert f"shard {broken}" in loop.health.checks()
        assert (h.family.domain, 2) in h.metrics.quarantined
