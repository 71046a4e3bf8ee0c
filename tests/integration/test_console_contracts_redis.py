"""The console's port contracts on the Redis adapters, on a real redis-server."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.router.dead_letters import (
    RedisDeadLetterArchive,
    RedisStreamDeadLetterSink,
)
from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
from eco_router.adapters.redis.router.shard_progress import RedisShardProgress
from eco_router.application.ports import (
    DeadLetterArchive,
    DeadLetterSink,
    EventSource,
    ShardProgress,
)
from tests.contracts.console_ports import DeadLetterArchiveContract, Fields, ShardProgressContract
from tests.contracts.factories import GROUP, TAGGED_FAMILIES


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TestRedisDeadLetterArchive(DeadLetterArchiveContract):
    @pytest.fixture(autouse=True)
    def _backend(self, streams_redis: Redis) -> None:
        self.redis = streams_redis

    async def make_archive(self) -> DeadLetterArchive:
        return RedisDeadLetterArchive(self.redis)

    async def make_sink(self) -> DeadLetterSink:
        return RedisStreamDeadLetterSink(self.redis)

    async def entries(self, stream: str) -> list[tuple[str, Fields]]:
        return [(_text(i), fields) for i, fields in await self.redis.xrange(stream)]


class TestRedisShardProgress(ShardProgressContract):
    @pytest.fixture(autouse=True)
    def _backend(self, streams_redis: Redis) -> None:
        self.redis = streams_redis

    async def make_progress(self) -> ShardProgress:
        return RedisShardProgress(self.redis, families=self.families, group=GROUP)

    async def make_source(self) -> EventSource:
        return RedisStreamEventSource(self.redis, families=self.families, group=GROUP, consumer="c")

    async def append(self, stream: str, fields: Mapping[bytes, bytes]) -> str:
        return _text(await self.redis.xadd(stream, dict(fields)))  # type: ignore[arg-type]


# The same contracts on the hash-tagged shard names of a Redis Cluster layout, on a standalone
# server (which takes any key).


class TestRedisDeadLetterArchiveTagged(TestRedisDeadLetterArchive):
    families = TAGGED_FAMILIES


class TestRedisShardProgressTagged(TestRedisShardProgress):
    families = TAGGED_FAMILIES
