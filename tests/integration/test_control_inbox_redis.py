"""A worker's read of its control messages on real Redis, through the producer SDK (blocking
and asyncio): it starts after what was acknowledged, so a cancel recorded after thousands of
acknowledged inputs is seen by a read that does not wait at all."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.control_store import RedisControlStore
from eco_router.adapters.redis.keys import JobKeys
from eco_router.adapters.system_clock import SystemClock
from eco_router.domain.control import ControlKind
from eco_router.producer import connect, connect_async, producer_config
from eco_router.testing import RedisServer
from tests.contracts.control_store import cancel, record, reply

pytestmark = pytest.mark.integration
JOB = "job-many"


async def acknowledged_then_cancelled(redis: Redis, count: int) -> RedisControlStore:
    config = producer_config(domain="chat", shards=4)
    store = RedisControlStore(redis, families=[config.family], clock=SystemClock())
    for n in range(count):
        message_id = await record(store, reply(str(n), f"r{n}", job_id=JOB))
        assert await store.acknowledge("chat", JOB, message_id)
    await record(store, cancel("stop", job_id=JOB))
    return store


class TestAReadStartsAfterWhatWasAcknowledged:
    async def test_a_blocking_worker_sees_a_cancel_after_many_acknowledged_without_waiting(
        self, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        await acknowledged_then_cancelled(streams_redis, 1000)
        publisher = connect(streams_server.url, producer_config(domain="chat", shards=4))

        found = publisher.next_control(JOB, timeout_s=0)

        assert found is not None
        assert found.kind is ControlKind.CANCEL

    async def test_an_asyncio_worker_sees_it_too(
        self, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        await acknowledged_then_cancelled(streams_redis, 150)
        publisher = connect_async(streams_server.url, producer_config(domain="chat", shards=4))

        found = await publisher.next_control(JOB, timeout_s=0)

        assert found is not None
        assert found.kind is ControlKind.CANCEL

    async def test_more_messages_waiting_than_a_page_are_all_handed(
        self, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        config = producer_config(domain="chat", shards=4)
        store = RedisControlStore(streams_redis, families=[config.family], clock=SystemClock())
        for n in range(150):
            await record(store, reply(str(n), f"r{n}", job_id=JOB))
        publisher = connect(streams_server.url, config)

        handed = []
        for message in publisher.control_messages(JOB, timeout_s=0):
            handed.append(message.number)

        assert handed == list(range(1, 151))

    async def test_acknowledged_bodies_leave_the_log(self, streams_redis: Redis) -> None:
        await acknowledged_then_cancelled(streams_redis, 300)
        keys = JobKeys.in_family(producer_config(domain="chat", shards=4).family, JOB)

        assert await streams_redis.xlen(keys.control) == 1
        assert await streams_redis.hget(keys.control_state, "waiting") == b"1"
