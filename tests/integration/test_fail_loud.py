"""Failing loud and recovering by itself: a shard key of the wrong type, Redis out of memory,
a consumer group destroyed under the router. Each on real redis-servers, default settings
unless a comment says why not."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from redis.asyncio import Redis

from tests.integration.support import (
    CHAT,
    GROUP,
    SCAN,
    PubSubCollector,
    WorkerProcess,
    Workers,
    add_event,
    add_raw,
    dead_letters,
    eventually,
    job_in_shard,
    pending_count,
)

# A quarantined shard is tried again every 10 s by default: recovery may take that long.
RECOVERY_S = 30.0


async def readiness(worker: WorkerProcess) -> tuple[int, dict[str, Any]]:
    response = await worker.get("/ready")
    return response.status_code, response.json()["checks"]


async def ready_again(worker: WorkerProcess) -> bool:
    status, _ = await readiness(worker)
    return status == 200


def error_lines(worker: WorkerProcess, *words: str) -> list[str]:
    return [
        line
        for line in worker.log().splitlines()
        if " ERROR " in line and all(w in line for w in words)
    ]


def warning_lines(worker: WorkerProcess, *words: str) -> list[str]:
    return [
        line
        for line in worker.log().splitlines()
        if " WARNING " in line and all(w in line for w in words)
    ]


def one_job_per_shard(stem: str, *, skip: str) -> list[tuple[str, str]]:
    """(family prefix, job id) of a job on every shard of both families but `skip`."""
    jobs = []
    for family in (SCAN, CHAT):
        for shard in range(family.shards):
            if f"{family.prefix}:{shard}" != skip:
                jobs.append((family.prefix, job_in_shard(family, shard, f"{stem}-{family.domain}")))
    return jobs


async def add_to_each(redis: Redis, jobs: list[tuple[str, str]], seq: int) -> None:
    for prefix, job in jobs:
        await add_event(redis, job, seq, family=CHAT if prefix == CHAT.prefix else SCAN)


async def out_of_memory(redis: Redis) -> None:
    await redis.config_set("maxmemory-policy", "noeviction")
    await redis.config_set("maxmemory", "1")


async def memory_back(redis: Redis) -> None:
    await redis.config_set("maxmemory", "0")


class TestAShardKeyOfTheWrongType:
    async def test_at_startup_the_other_shards_route_and_the_shard_recovers_once_fixed(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        broken = "scan:events:2"
        await streams_redis.set(broken, "x")
        worker = await workers.start()
        jobs = one_job_per_shard("startup", skip=broken)

        await add_to_each(streams_redis, jobs, 1)

        await eventually(
            lambda: all(subscriber.seqs(job) == [1] for _, job in jobs),
            what="every other shard of both domains routing",
        )
        status, checks = await readiness(worker)
        assert status == 503
        assert checks[f"shard {broken}"].startswith("quarantined: ")
        assert "WRONGTYPE" in checks[f"shard {broken}"]
        assert await worker.metric("event_router_shard_quarantined", domain="scan", shard="2") == 1
        assert len(error_lines(worker, broken, "WRONGTYPE", "quarantined")) == 1

        await streams_redis.delete(broken)
        late = job_in_shard(SCAN, 2, "fixed")
        await add_event(streams_redis, late, 1)

        await eventually(
            lambda: subscriber.seqs(late) == [1], timeout_s=RECOVERY_S, what="fixed shard"
        )
        await eventually(lambda: ready_again(worker), timeout_s=RECOVERY_S, what="ready")
        assert await worker.metric("event_router_shard_quarantined", domain="scan", shard="2") == 0
        assert len(error_lines(worker, broken)) == 1

    async def test_while_routing_one_shard_stops_alone_and_recovers_once_fixed(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        broken = "scan:events:1"
        worker = await workers.start()
        jobs = one_job_per_shard("running", skip=broken)
        victim = job_in_shard(SCAN, 1, "victim")
        await add_to_each(streams_redis, jobs, 1)
        await add_event(streams_redis, victim, 1)
        await eventually(
            lambda: all(subscriber.seqs(job) == [1] for _, job in [*jobs, ("", victim)]),
            what="everything routed before the key breaks",
        )

        await streams_redis.delete(broken)
        await streams_redis.rpush(broken, "x")
        await add_to_each(streams_redis, jobs, 2)

        await eventually(
            lambda: all(subscriber.seqs(job) == [1, 2] for _, job in jobs),
            what="every other shard of both domains still routing",
        )
        await eventually(
            lambda: len(error_lines(worker, broken, "WRONGTYPE", "quarantined")) == 1,
            what="the broken shard named in an error",
        )
        status, checks = await readiness(worker)
        assert status == 503
        assert "WRONGTYPE" in checks[f"shard {broken}"]

        await streams_redis.delete(broken)
        await add_event(streams_redis, victim, 2)

        await eventually(
            lambda: subscriber.seqs(victim) == [1, 2], timeout_s=RECOVERY_S, what="fixed shard"
        )
        await eventually(lambda: ready_again(worker), timeout_s=RECOVERY_S, what="ready")
        assert len(error_lines(worker, broken)) == 1


class TestRedisOutOfMemory:
    async def test_at_startup_routing_waits_unready_then_starts_when_memory_frees(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        jobs = one_job_per_shard("oom-start", skip="")
        await add_to_each(streams_redis, jobs, 1)
        await out_of_memory(streams_redis)
        worker = await workers.start()

        async def retrying() -> bool:
            status, checks = await readiness(worker)
            return status == 503 and checks["consumer"].startswith("retrying: ")

        await eventually(retrying, what="/ready 503 naming the consumer")
        # Several attempts fail meanwhile (back-off from 50 ms): still one warning.
        await asyncio.sleep(2)
        await memory_back(streams_redis)

        await eventually(
            lambda: all(subscriber.seqs(job) == [1] for _, job in jobs), what="all routed"
        )
        await eventually(lambda: ready_again(worker), what="ready")
        assert len(warning_lines(worker, "consumer", "maxmemory")) == 1
        assert error_lines(worker) == []

    async def test_while_routing_valid_events_wait_and_none_is_dead_lettered(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        # The reclaimer runs far more often than by default, with a short idle time: a claim
        # counts a delivery, so this is the harshest case for the delivery counts; what
        # must hold (no valid event dead-lettered) holds for any timing.
        worker = await workers.start(
            EVENT_ROUTER_RECLAIM_MIN_IDLE_MS="100", EVENT_ROUTER_RECLAIM_INTERVAL_S="0.1"
        )
        jobs = one_job_per_shard("oom-run", skip="")
        await add_to_each(streams_redis, jobs, 1)
        await eventually(
            lambda: all(subscriber.seqs(job) == [1] for _, job in jobs), what="first events"
        )

        worker.process.send_signal(signal.SIGSTOP)
        try:
            for seq in (2, 3, 4):
                await add_to_each(streams_redis, jobs, seq)
            await out_of_memory(streams_redis)
        finally:
            worker.process.send_signal(signal.SIGCONT)
        # The read blocked on the server took what was there when the first of them came:
        # those are pending, retried while memory is out; the others wait unread.
        await eventually(lambda: _pending_at_least(streams_redis, 1), what="events read")

        async def retrying() -> bool:
            status, checks = await readiness(worker)
            return status == 503 and checks["consumer"].startswith("retrying: ")

        await eventually(retrying, what="/ready 503 naming the consumer")
        # Many reclaim passes would run meanwhile.
        await asyncio.sleep(3)
        await memory_back(streams_redis)

        await eventually(
            lambda: all(subscriber.seqs(job) == [1, 2, 3, 4] for _, job in jobs),
            what="every event routed once memory frees",
        )
        assert await eventually(lambda: _pending_reaches(streams_redis, 0), what="all acked")
        assert await dead_letters(streams_redis) == []
        assert await dead_letters(streams_redis, CHAT) == []
        await eventually(lambda: ready_again(worker), what="ready")


class TestAConsumerGroupDestroyed:
    async def test_it_is_created_again_where_the_router_was_so_nothing_is_routed_twice(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        worker = await workers.start()
        jobs = [job_in_shard(SCAN, shard, "regroup") for shard in range(SCAN.shards)]
        for seq in (1, 2, 3):
            for job in jobs:
                await add_event(streams_redis, job, seq)
        await add_raw(streams_redis, SCAN.stream_for(jobs[1]), {b"junk": b"1"})
        await eventually(
            lambda: all(subscriber.seqs(job) == [1, 2, 3] for job in jobs), what="first routing"
        )
        await eventually(lambda: _dead_letter_count(streams_redis, 1), what="the junk entry")

        for stream in SCAN.streams:
            await streams_redis.xgroup_destroy(stream, GROUP)
        for job in jobs:
            await add_event(streams_redis, job, 4)

        await eventually(
            lambda: all(subscriber.seqs(job)[-1:] == [4] for job in jobs), what="seq 4 routed"
        )
        assert [subscriber.seqs(job) for job in jobs] == [[1, 2, 3, 4]] * len(jobs)
        assert await eventually(lambda: _pending_reaches(streams_redis, 0), what="all acked")
        assert len(await dead_letters(streams_redis)) == 1
        assert len(error_lines(worker, "consumer group", "created again after")) == SCAN.shards


async def _pending_reaches(redis: Redis, count: int) -> bool:
    return await pending_count(redis) == count


async def _pending_at_least(redis: Redis, count: int) -> bool:
    return await pending_count(redis) >= count


async def _dead_letter_count(redis: Redis, count: int) -> bool:
    return len(await dead_letters(redis)) == count
