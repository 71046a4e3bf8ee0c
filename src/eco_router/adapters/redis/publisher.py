"""Producer side: idempotent, sharded appends of progress events, sync and asyncio."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
import redis.asyncio

from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.ports import ProgressPublisher
from eco_router.domain.progress import (
    InvalidProgressEvent,
    ProgressEvent,
    StagePlan,
    progress_event,
)
from eco_router.domain.streams import StreamFamily

DEFAULT_IDEMPOTENCY_TTL_S = 7200
DEFAULT_MAXLEN = 10_000


@dataclass(frozen=True, slots=True)
class PublishCall:
    """One validated publish: the script's keys and arguments."""

    keys: list[str]
    args: list[str | int]


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Where and how a producer writes: the family, the stage plan, the window and the trim."""

    family: StreamFamily
    plan: StagePlan = field(default_factory=StagePlan)
    idempotency_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_S
    maxlen: int = DEFAULT_MAXLEN

    def call(
        self,
        job_id: str,
        stage: str,
        status: str,
        *,
        result: Any = None,
        progress: int | None = None,
        seq: int | None = None,
    ) -> PublishCall:
        """Validate and encode; raises `InvalidProgressEvent` before any I/O."""
        event = progress_event(
            job_id, stage, status, plan=self.plan, result=result, progress=progress, seq=seq
        )
        stream = self.family.stream_for(event.job_id)
        # The hash tag puts the marker in the stream's Redis Cluster slot: one script, one slot.
        marker = f"{{{stream}}}:once:{event.idempotency_suffix}"
        args: list[str | int] = [self.idempotency_ttl_s, self.maxlen]
        for name, value in stream_fields(event).items():
            args += (name, value)
        return PublishCall([stream, marker], args)


def stream_fields(event: ProgressEvent) -> dict[str, str]:
    """The entry's string fields; `result` as JSON with non-ASCII kept as is."""
    fields = {
        "job_id": event.job_id,
        "stage": event.stage,
        "status": event.status.value,
        "seq": str(event.seq),
        "ts": f"{time.time():.3f}",
    }
    if event.progress is not None:
        fields["progress"] = str(event.progress)
    if event.has_result:
        try:
            fields["result"] = orjson.dumps(event.result).decode()
        except TypeError as error:
            raise InvalidProgressEvent(f"result is not JSON-encodable: {error}") from error
    return fields


class AsyncStreamPublisher(ProgressPublisher):
    """Publishes progress events from asyncio code; returns the stream entry id."""

    def __init__(self, client: redis.asyncio.Redis, config: ProducerConfig) -> None:
        self.config = config
        self._script = client.register_script(load_lua("publish_once.lua"))

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
        call = self.config.call(job_id, stage, status, result=result, progress=progress, seq=seq)
        return _text(await self._script(keys=call.keys, args=call.args))


class StreamPublisher:
    """Publishes progress events from synchronous code (a Celery task, a thread)."""

    def __init__(self, client: redis.Redis, config: ProducerConfig) -> None:
        self.config = config
        self._script = client.register_script(load_lua("publish_once.lua"))

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
        call = self.config.call(job_id, stage, status, result=result, progress=progress, seq=seq)
        return _text(self._script(keys=call.keys, args=call.args))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
