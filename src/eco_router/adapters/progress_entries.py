"""Producer entries: validation, shard, idempotency key and fields, shared by every publisher."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from eco_router.adapters.trace_context import current_trace_fields
from eco_router.domain.event import JobEvent
from eco_router.domain.event_size import EventSizeLimits
from eco_router.domain.parsing import DEFAULT_MAX_FIELD_BYTES, parse_entry
from eco_router.domain.progress import (
    InvalidProgressEvent,
    ProgressEvent,
    StagePlan,
    progress_event,
)
from eco_router.domain.streams import StreamFamily, slot_named

DEFAULT_IDEMPOTENCY_TTL_S = 7200
DEFAULT_MAXLEN = 10_000
# The longest entry id Redis can give: the size check never passes an event the router refuses.
_LONGEST_ENTRY_ID = f"{2**64 - 1}-{2**64 - 1}"


@dataclass(frozen=True, slots=True)
class PreparedEntry:
    """A validated event ready to append: its stream, its idempotency key and its fields."""

    stream: str
    idempotency_key: str
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Where and how a producer writes: the family, the stage plan, the window, the trim and
    the size limits, which must be those of the routers (`EVENT_ROUTER_MAX_*`)."""

    family: StreamFamily
    plan: StagePlan = field(default_factory=StagePlan)
    idempotency_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_S
    maxlen: int = DEFAULT_MAXLEN
    size_limits: EventSizeLimits = field(default_factory=EventSizeLimits)
    max_field_bytes: int = DEFAULT_MAX_FIELD_BYTES
    # Replicas that must have each entry before `publish_stage_event` returns (0: none).
    wait_replicas: int = 0
    wait_timeout_ms: int = 500

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
        marker = f"{slot_named(stream)}:once:{event.idempotency_suffix}"
        fields = stream_fields(event) | current_trace_fields()
        self._check_routable(stream, fields)
        return PreparedEntry(stream, marker, fields)

    def _check_routable(self, stream: str, fields: dict[str, str]) -> None:
        """Refuse what the router would dead-letter: a field or the routed JSON too large."""
        routed = parse_entry(
            domain=self.family.domain,
            stream=stream,
            entry_id=_LONGEST_ENTRY_ID,
            fields={name.encode(): value.encode() for name, value in fields.items()},
            max_field_bytes=self.max_field_bytes,
        )
        if not isinstance(routed, JobEvent):
            raise InvalidProgressEvent(f"the router would refuse this event: {routed.detail}")
        size = len(orjson.dumps(routed.as_payload()))
        too_large = self.size_limits.check(
            size, stage=routed.stage, status=routed.status, has_result=routed.has_result
        )
        if too_large is not None:
            raise InvalidProgressEvent(
                f"event too large: {too_large.detail} (EVENT_ROUTER_MAX_EVENT_BYTES / "
                "EVENT_ROUTER_MAX_RESULT_BYTES; send large results by reference)"
            )


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
