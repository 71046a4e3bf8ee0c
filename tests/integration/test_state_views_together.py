"""Job views asked for together (a burst of SSE streams opening) are read in one pipeline."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from eco_router.adapters.redis.keys import JobKeys
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.application.errors import PermanentError
from eco_router.application.port_values import JobView
from eco_router.domain.streams import StreamFamily

pytestmark = pytest.mark.integration

FAMILY = StreamFamily("scan:events", 4)
JOBS = [f"job-{n}" for n in range(100)]


def store(redis: Redis) -> RedisLuaStateStore:
    return RedisLuaStateStore(
        redis,
        families=[FAMILY],
        group="router",
        state_ttl_s=60,
        markers_ttl_s=60,
        history_size=10,
    )


async def with_state(redis: Redis) -> None:
    for job in JOBS:
        keys = JobKeys.of("scan", job)
        await redis.set(keys.state, f"state of {job}")
        await redis.rpush(keys.history, f"first of {job}", f"second of {job}")


class CountingPipelines(Redis):
    """A client that counts the pipelines it sends."""

    pipelines = 0

    def pipeline(self, transaction: bool = True, shard_hint: object = None) -> Pipeline:
        self.pipelines += 1
        return super().pipeline(transaction, shard_hint)  # type: ignore[arg-type]


async def test_views_asked_together_are_one_pipeline_and_each_gets_its_own(
    streams_redis: Redis,
) -> None:
    await with_state(streams_redis)
    counting = CountingPipelines.from_pool(streams_redis.connection_pool)
    views = store(counting)

    got = await asyncio.gather(*(views.view("scan", job) for job in JOBS))

    assert [(v.state, v.history) for v in got] == [
        (f"state of {j}".encode(), [f"first of {j}".encode(), f"second of {j}".encode()])
        for j in JOBS
    ]
    assert counting.pipelines == 1


async def test_a_job_whose_keys_are_refused_fails_its_own_view_only(streams_redis: Redis) -> None:
    await with_state(streams_redis)
    broken = JobKeys.of("scan", JOBS[3])
    await streams_redis.delete(broken.history)
    await streams_redis.set(broken.history, "not a list")
    views = store(streams_redis)

    got = await asyncio.gather(*(views.view("scan", job) for job in JOBS), return_exceptions=True)

    assert isinstance(got[3], PermanentError)
    assert "WRONGTYPE" in str(got[3])
    assert all(isinstance(v, JobView) for n, v in enumerate(got) if n != 3)


async def test_a_caller_giving_up_costs_the_others_nothing(streams_redis: Redis) -> None:
    await with_state(streams_redis)
    views = store(streams_redis)
    asked = [asyncio.ensure_future(views.view("scan", job)) for job in JOBS]
    await asyncio.sleep(0)
    asked[0].cancel()

    got = await asyncio.gather(*asked, return_exceptions=True)

    assert isinstance(got[0], asyncio.CancelledError)
    assert [v.state for v in got[1:]] == [f"state of {j}".encode() for j in JOBS[1:]]  # type: ignore[union-attr]
