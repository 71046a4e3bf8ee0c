"""Producer side: idempotent, sharded appends of progress events, sync and asyncio."""

from __future__ import annotations

from typing import Any

import redis
import redis.cluster

from eco_router.adapters.progress_entries import PreparedEntry, ProducerConfig
from eco_router.adapters.redis.closed_writes import translate_closed_writes
from eco_router.adapters.redis.connection import RedisClient
from eco_router.adapters.redis.replica_wait import ReplicaWait
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.ports import ProgressPublisher


def script_arguments(
    entry: PreparedEntry, config: ProducerConfig
) -> tuple[list[str], list[str | int]]:
    """KEYS and ARGV of `publish_once.lua`."""
    args: list[str | int] = [config.idempotency_ttl_s, config.maxlen]
    for name, value in entry.fields.items():
        args += (name, value)
    return [entry.stream, entry.idempotency_key], args


class AsyncStreamPublisher(ProgressPublisher):
    """Publishes progress events from asyncio code; returns the stream entry id."""

    def __init__(self, client: RedisClient, config: ProducerConfig) -> None:
        # Also on a client of the caller's: a connection closed under a call then fails as
        # redis-py's ConnectionError (after its retry), not as the event loop's raw error.
        translate_closed_writes()
        self.config = config
        self._client = client
        self._script = client.register_script(load_lua("publish_once.lua"))
        self._wait = ReplicaWait(config.wait_replicas, config.wait_timeout_ms)

    async def publish_stage_event(
        self,
        job_id: str,
        stage: str,
        status: str,
        *,
        result: Any = None,
        progress: int | None = None,
        seq: int | None = None,
    ) -> str:
        entry = self.config.call(job_id, stage, status, result=result, progress=progress, seq=seq)
        keys, args = script_arguments(entry, self.config)
        return _text(await self._wait.call(self._client, self._script, keys, args))


class StreamPublisher:
    """Publishes progress events from synchronous code (a Celery task, a thread)."""

    def __init__(
        self, client: redis.Redis | redis.cluster.RedisCluster, config: ProducerConfig
    ) -> None:
        self.config = config
        self._client = client
        self._script = client.register_script(load_lua("publish_once.lua"))
        self._wait = ReplicaWait(config.wait_replicas, config.wait_timeout_ms)

    def publish_stage_event(
        self,
        job_id: str,
        stage: str,
        status: str,
        *,
        result: Any = None,
        progress: int | None = None,
        seq: int | None = None,
    ) -> str:
        entry = self.config.call(job_id, stage, status, result=result, progress=progress, seq=seq)
        keys, args = script_arguments(entry, self.config)
        return _text(self._wait.call_sync(self._client, self._script, keys, args))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
