"""The job-progress event as the router understands it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

RESERVED_FIELDS = frozenset({"job_id", "stage", "status", "seq", "ts", "progress", "result"})
# Set by the router on every routed event: a producer's fields of these names are dropped.
ROUTER_FIELDS = frozenset({"event_id", "prev_event_id", "restart", "text_check"})
# A text delta of a job's answer: `content` is appended to the job's text (per `node`).
TOKEN_STAGE = "token"
# The reference chat worker numbers its tokens from here; stages stay below.
FIRST_TOKEN_SEQ = 1001
CANCEL_REQUESTED = "cancel_requested"
INPUT_RECEIVED = "input_received"
# Events of the job's lifecycle around its stages, judged apart (`judge_lifecycle`): never
# stale after later stages, never making later stages stale. `needs_input` is one: the
# reference numbers it above `done` (190 > 181), which would otherwise make the job's end stale.
LIFECYCLE_STAGES = frozenset({CANCEL_REQUESTED, INPUT_RECEIVED, "needs_input"})


def ends_job(stage: str | None, status: str | None) -> bool:
    """Whether a stage event is its job's end: `done`, or a failure. Nothing follows it: the
    gateway ends a stream on it, a control request is refused after it, and a token written
    after it is stale."""
    return stage == "done" or status in {"done", "failed"}


@dataclass(frozen=True, slots=True, order=True)
class StreamEntryId:
    """A Redis stream entry id, `<milliseconds>-<sequence>`."""

    ms: int
    sequence: int

    @classmethod
    def parse(cls, text: str) -> StreamEntryId:
        ms, _, sequence = text.partition("-")
        return cls(int(ms), int(sequence or 0))

    def __str__(self) -> str:
        return f"{self.ms}-{self.sequence}"


# No extra fields: shared, and read only.
_NO_EXTRA: Mapping[str, str] = MappingProxyType({})


# A named tuple, as immutable as a frozen dataclass: one is built per entry read, and a frozen
# dataclass of these thirteen fields costs about five microseconds to build, a tenth of that.
class JobEvent(NamedTuple):
    """One valid progress event of one job, read from one stream entry."""

    domain: str
    stream: str
    stream_id: str
    job_id: str
    seq: int
    stage: str | None = None
    status: str | None = None
    ts: str | None = None
    progress: int | None = None
    result: Any = None
    has_result: bool = False
    extra: Mapping[str, str] = _NO_EXTRA
    # A token's run of the task (its `attempt` field): a higher one restarts the job's text.
    attempt: int = 0

    @property
    def job_key(self) -> tuple[str, str]:
        return (self.domain, self.job_id)

    @property
    def is_terminal(self) -> bool:
        """Done or failed: nothing follows for this job (`ends_job`)."""
        return ends_job(self.stage, self.status)

    @property
    def is_token(self) -> bool:
        """A text delta of the job's answer, not a step of its lifecycle."""
        return self.stage == TOKEN_STAGE

    @property
    def is_lifecycle(self) -> bool:
        """A control message's announcement, or the job's question to its user: not a stage."""
        return self.stage in LIFECYCLE_STAGES

    @property
    def lifecycle_marker(self) -> str:
        """The name a lifecycle event's application is marked under, apart from stage seqs."""
        return f"{self.stage}:{self.seq}"

    @property
    def content(self) -> str:
        """A token's text delta ("" for any other event)."""
        return self.extra.get("content", "")

    @property
    def node(self) -> str | None:
        """The graph node a token's text belongs to, when the producer names one."""
        return self.extra.get("node") or None

    def as_payload(self) -> dict[str, Any]:
        """The routed message: the entry's fields, typed, plus where it came from."""
        payload: dict[str, Any] = dict(self.extra)
        payload["job_id"] = self.job_id
        payload["seq"] = self.seq
        for name in ("stage", "status", "ts"):
            value = getattr(self, name)
            if value is not None:
                payload[name] = value
        if self.progress is not None:
            payload["progress"] = self.progress
        if self.has_result:
            payload["result"] = self.result
        payload["stream_id"] = self.stream_id
        payload["domain"] = self.domain
        return payload
