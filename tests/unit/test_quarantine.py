"""A shard the server refuses for good is quarantined; the other shards go on routing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import pytest

from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.port_values import Applied, EncodedEvent, ReadStart
from eco_router.application.router_health import RouterHealth
from tests.unit.factories import GROUP, Harness, eventually

QUARANTINE_RETRY_MS = 10_001


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

    async def test_while_routing_the_shard_stops_alone_and_routes_again_once_fixed(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        h = Harness()
        jobs = jobs_on_every_shard(h, "job")
        broken = h.family.streams[1]
        victim, other = jobs[broken], jobs[h.family.streams[0]]
        loop = h.consume_loop()

        async with running(loop):
            h.xadd(victim, 1)
            await eventually(lambda: h.published_seqs(victim) == [1])
            h.streams.break_shard(broken)
            for job in jobs.values():
                if job != victim:
                    h.xadd(job, 1)
            await eventually(lambda: all(h.published_seqs(j) == [1] for j in jobs.values()))
            await eventually(lambda: f"shard {broken}" in loop.health.checks())

            h.streams.delete_stream(broken)
            h.clock.advance(QUARANTINE_RETRY_MS)
            h.xadd(victim, 2)
            h.xadd(other, 2)  # wakes the loop, which waits for appends on the readable shards
            await eventually(lambda: h.published_seqs(victim) == [1, 2])

        assert f"shard {broken}" not in loop.health.checks()
        assert h.metrics.quarantined == set()
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1
        assert broken in errors[0].message


class TestRouterHealth:
    def test_a_quarantine_is_logged_once_per_episode(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        h = Harness()
        health = RouterHealth(clock=h.clock, metrics=h.metrics, families=[h.family])
        stream = h.family.streams[0]

        for _ in range(3):
            health.quarantine(stream, PermanentError(stream, "WRONGTYPE"))

        assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
        assert health.blocked() == {stream}
        assert health.due() == []
        h.clock.advance(QUARANTINE_RETRY_MS)
        assert health.due() == [stream]

    def test_a_transient_episode_warns_once_and_fails_readiness_until_it_ends(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        h = Harness()
        health = RouterHealth(clock=h.clock, metrics=h.metrics)
        health.task_running("consumer")

        for _ in range(5):
            health.troubled("consumer", TransientError("OOM command not allowed"))
        troubled = health.checks()
        health.untroubled("consumer")

        assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1
        assert troubled == {"consumer": "retrying: OOM command not allowed"}
        assert health.checks() == {"consumer": "ok"}


class BrokenJobStore(InMemoryStateStore):
    """A state store whose keys of one job hold the wrong type: every batch with it fails."""

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        if any(item.event.job_id == "broken-job" for item in events):
            raise PermanentError("", "apply batch: WRONGTYPE Operation against a key")
        return await super().apply(events, fence, in_order)


class TestAJobKeyOfTheWrongType:
    async def test_its_batch_stays_pending_and_no_shard_is_quarantined(self) -> None:
        h = Harness()
        h.store = BrokenJobStore(
            clock=h.clock,
            streams=h.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=100,
        )
        loop = h.consume_loop()

        async with running(loop):
            h.xadd("broken-job", 1)
            await eventually(lambda: h.groups_ready() and len(h.pending()) == 1)
            h.xadd("job-2", 1)
            await eventually(lambda: h.published_seqs("job-2") == [1])

        assert [p.consumer for p in h.pending().values()] == [h.consumer]
        assert not any(name.startswith("shard ") for name in loop.health.checks())
        assert h.metrics.quarantined == set()
