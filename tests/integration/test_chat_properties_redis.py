"""The chat answer's property (tests/unit/test_chat_properties.py) with the job state in the
Redis store on a real Redis: any interleaving of the answer's faults, routers that die and
take over under higher fencing tokens (each written to the shard's epoch key, as the lease
store writes it) and viewers that come and go ends with every viewer holding the final
attempt's text, and `done` once. The streams, the fan-out and the gateway stay in memory: the
store finds no stream in Redis, so it sees no gap in the read order and no entry gone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.application.ports import StateStore
from eco_router.testing import RedisServer
from tests.unit.factories import FAMILY, GROUP
from tests.unit.test_chat_properties import (
    JOB,
    Answer,
    Backend,
    Step,
    assert_every_viewer_got_the_final_text,
    chat_answers,
    play,
)

# As the unit tier's gateway keeps them.
HISTORY_SIZE = 100
STATE_TTL_S = 3600
MARKERS_TTL_S = 7200


class RedisBackend(Backend):
    """The Redis store, fenced by the shards' epoch keys."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    def store(self) -> StateStore:
        return RedisLuaStateStore(
            self._redis,
            families=[FAMILY],
            group=GROUP,
            state_ttl_s=STATE_TTL_S,
            markers_ttl_s=MARKERS_TTL_S,
            history_size=HISTORY_SIZE,
        )

    async def took_over(self, fence: Mapping[str, int]) -> None:
        keys = GroupKeys(GROUP)
        await self._redis.mset({keys.epoch(stream): token for stream, token in fence.items()})

    @staticmethod
    def keys() -> list[str]:
        """Every key an example may write: the job's and the shards' epochs."""
        job = JobKeys.in_family(FAMILY, JOB)
        epochs = [GroupKeys(GROUP).epoch(stream) for stream in FAMILY.streams]
        return [job.state, job.history, job.markers, job.text_state, job.text, *epochs]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


async def play_on_redis(
    url: str, answer: list[Step], after_the_end: list[Step], queue_size: int, direct: bool
) -> Answer:
    """Play the example on a fresh set of keys, and delete every key it wrote."""
    redis = Redis.from_url(url)
    try:
        assert await redis.dbsize() == 0, "an earlier example left keys behind"
        return await play(
            answer,
            after_the_end,
            queue_size=queue_size,
            direct=direct,
            backend=RedisBackend(redis),
        )
    finally:
        await redis.delete(*RedisBackend.keys())
        await redis.aclose()


# As many as the in-memory run: about 10 s on an idle machine.
@chat_answers(max_examples=250)
def test_every_viewer_ends_with_the_final_attempts_text_and_done_once(
    server: RedisServer,
    answer: list[Step],
    after_the_end: list[Step],
    queue_size: int,
    direct: bool,
) -> None:
    played = asyncio.run(play_on_redis(server.url, answer, after_the_end, queue_size, direct))

    assert_every_viewer_got_the_final_text(played)
