"""Producer entries: validation, shard, idempotency key and fields, shared by every publisher."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from eco_router.adapters.trace_context import current_trace_fields
from eco_router.domain.event import TOKEN_STAGE, JobEvent
from eco_router.domain.event_size import EventSizeLimits
from eco_router.domain.parsing import DEFAULT_MAX_FIELD_BYTES, MAX_SEQ, parse_entry
from eco_router.domain.progress import (
    InvalidProgressEvent,
    ProgressEvent,
    StageEvent,
    StagePlan,
    Status,
)
from eco_router.domain.streams import StreamFamily, slot_named
from eco_router.domain.token_entries import (
    DEFAULT_COALESCE_MS,
    Coalescing,
    TokenEntry,
    TokenRun,
    coalescing,
    token_entry,
)

DEFAULT_IDEMPOTENCY_TTL_S = 7200
DEFAULT_MAXLEN = 10_000
# The longest entry id Redis can give: the size check never passes an event the router refuses.
_LONGEST_ENTRY_ID = f"{2**64 - 1}-{2**64 - 1}"
# Left free when deltas are merged: the router puts its event ids (and, on a new attempt's
# first token, `restart`) first in a routed token, about 75 bytes.
_ROUTER_STAMP_BYTES = 128


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

    def stage_event(self, call: StageEvent) -> PreparedEntry:
        """Validate and encode; raises `InvalidProgressEvent` before any I/O."""
        event = call.validated(self.plan)
        stream = self.family.stream_for(event.job_id)
        fields = stream_fields(event) | current_trace_fields()
        self._check_routable(stream, fields)
        return PreparedEntry(stream, _marker(stream, event.idempotency_suffix), fields)

    def token(
        self, job_id: str, content: str, *, seq: int, node: str | None = None, attempt: int = 0
    ) -> PreparedEntry:
        """One token a worker numbered itself, validated and encoded; raises
        `InvalidProgressEvent` before any I/O."""
        entry = token_entry(job_id, content, seq=seq, node=node, attempt=attempt)
        stream = self.family.stream_for(job_id)
        fields = token_fields(entry) | current_trace_fields()
        self._check_routable(stream, fields)
        return PreparedEntry(stream, _marker(stream, entry.idempotency_suffix), fields)

    def tokens(self, run: TokenRun, *, coalesce_ms: float = DEFAULT_COALESCE_MS) -> PreparedTokens:
        """How the entries of `run` are merged and encoded; the trace context is the caller's
        at this call."""
        stream = self.family.stream_for(run.job_id)
        trace = current_trace_fields()
        # Measured on an empty entry with the longest seq: the fields around the content.
        empty = token_fields(TokenEntry(run.job_id, MAX_SEQ, "", run.node, run.attempt)) | trace
        overhead = len(orjson.dumps(self._routed(stream, empty).as_payload()))
        budget = self.size_limits.max_event_bytes - overhead - _ROUTER_STAMP_BYTES
        return PreparedTokens(
            config=self,
            run=run,
            stream=stream,
            trace=trace,
            coalescing=coalescing(coalesce_ms, max_cost=budget),
        )

    def _check_routable(self, stream: str, fields: dict[str, str]) -> None:
        """Refuse what the router would dead-letter: a field or the routed JSON too large."""
        routed = self._routed(stream, fields)
        size = len(orjson.dumps(routed.as_payload()))
        too_large = self.size_limits.check(
            size, stage=routed.stage, status=routed.status, has_result=routed.has_result
        )
        if too_large is not None:
            raise InvalidProgressEvent(
                f"event too large: {too_large.detail} (EVENT_ROUTER_MAX_EVENT_BYTES / "
                "EVENT_ROUTER_MAX_RESULT_BYTES; send large results by reference)"
            )

    def _routed(self, stream: str, fields: dict[str, str]) -> JobEvent:
        """The event the router would make of `fields`; what it would refuse raises."""
        routed = parse_entry(
            domain=self.family.domain,
            stream=stream,
            entry_id=_LONGEST_ENTRY_ID,
            fields={name.encode(): value.encode() for name, value in fields.items()},
            max_field_bytes=self.max_field_bytes,
        )
        if not isinstance(routed, JobEvent):
            raise InvalidProgressEvent(f"the router would refuse this event: {routed.detail}")
        return routed


@dataclass(frozen=True, slots=True)
class PreparedTokens:
    """A validated run of tokens: its stream, its trace context and how its deltas merge."""

    config: ProducerConfig
    run: TokenRun
    stream: str
    trace: Mapping[str, str]
    coalescing: Coalescing

    def entry(self, index: int, content: str) -> PreparedEntry:
        """The run's `index`-th entry, checked against the router's limits."""
        return self.prepare(self.run.entry(index, content))

    def prepare(self, entry: TokenEntry) -> PreparedEntry:
        fields = token_fields(entry)
        fields.update(self.trace)
        self.config._check_routable(self.stream, fields)
        return PreparedEntry(self.stream, _marker(self.stream, entry.idempotency_suffix), fields)


def delta_cost(delta: str) -> int:
    """What `delta` adds to a routed token's JSON: its bytes as a JSON string's inside."""
    return len(orjson.dumps(delta)) - 2


def delta_text(item: object) -> str | None:
    """The text of one item of a token stream: a `str`, or an OpenAI-style chat completion
    chunk (`chunk.choices[0].delta.content`, as an object or as decoded JSON); None when it
    carries no text (a role-only first chunk, the usage chunk without choices)."""
    if isinstance(item, str):
        return item
    try:
        if isinstance(item, Mapping):
            choices = item.get("choices")
            delta = choices[0].get("delta") if choices else None
            content = delta.get("content") if delta else None
        else:
            choices = item.choices  # type: ignore[attr-defined]
            content = choices[0].delta.content if choices else None
    except (AttributeError, IndexError, KeyError, TypeError) as error:
        raise InvalidProgressEvent(
            f"a token must be a str or an OpenAI-style chunk "
            f"(chunk.choices[0].delta.content), not {type(item).__name__}"
        ) from error
    if content is not None and not isinstance(content, str):
        raise InvalidProgressEvent(f"a chunk's content must be a str, not {type(content).__name__}")
    return content


def token_fields(entry: TokenEntry) -> dict[str, str]:
    """A token entry's string fields, in the order the reference chat worker writes them."""
    fields = {
        "job_id": entry.job_id,
        "stage": TOKEN_STAGE,
        "status": Status.STREAMING.value,
        "seq": str(entry.seq),
        "ts": f"{time.time():.3f}",
        "content": entry.content,
    }
    if entry.node is not None:
        fields["node"] = entry.node
    if entry.attempt:
        fields["attempt"] = str(entry.attempt)
    return fields


def _marker(stream: str, suffix: str) -> str:
    # The hash tag puts the marker in the stream's Redis Cluster slot: one script, one slot.
    return f"{slot_named(stream)}:once:{suffix}"


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
