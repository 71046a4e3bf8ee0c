"""Producer entries: validation, shard, idempotency key and fields, shared by every publisher."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

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
class PreparedEntry:
    """A validated event ready to append: its stream, its idempotency key and its fields."""

    stream: str
    idempotency_key: str
    fields: dict[str, str]


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
    ) -> PreparedEntry:
        """Validate and encode; raises `InvalidProgressEvent` before any I/O."""
        event = progress_event(
            job_id, stage, status, plan=self.plan, result=result, progress=progress, seq=seq
        )
        stream = self.family.stream_for(event.job_id)
        # The hash tag puts the marker in the stream's Redis Cluster slot: one script, one slot.
        marker = f"{{{stream}}}:once:{event.idempotency_suffix}"
        return PreparedEntry(stream, marker, stream_fields(event))


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
