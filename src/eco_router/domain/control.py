"""Control messages a job's viewers send its worker (cancel, input), and the lifecycle events
that announce them in the job's event sequence."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from eco_router.domain.errors import DomainError
from eco_router.domain.event import CANCEL_REQUESTED, INPUT_RECEIVED, ends_job
from eco_router.domain.json_result import InvalidResult, parse_result

# A control body is a short JSON object (a reply, a reason); a bigger one is a result to send
# by reference. With the entry's other fields it stays below the 8 KiB event limit.
MAX_CONTROL_BODY_BYTES = 4096
# The console shows this much of a body that waits for its worker.
PREVIEW_BYTES = 200
REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
REQUEST_ID_FIELD = "request_id"
# The sender of a request made without a token (no secret configured): request ids are then
# shared by every viewer, as everything else is.
ANONYMOUS = "anonymous"


class InvalidControl(DomainError):
    """A control request that is not valid; the message says what is wrong in one line."""


class ControlKind(StrEnum):
    """What a viewer asks of a job's worker."""

    CANCEL = "cancel"
    INPUT = "input"

    @property
    def stage(self) -> str:
        """The lifecycle event that announces it to every viewer."""
        return CANCEL_REQUESTED if self is ControlKind.CANCEL else INPUT_RECEIVED

    @property
    def status(self) -> str:
        return "requested" if self is ControlKind.CANCEL else "received"


class ControlState(StrEnum):
    """Where a control message is: recorded by the gateway, handed to a worker at least once,
    or acknowledged by one (never handed again)."""

    RECORDED = "recorded"
    DELIVERED = "delivered"
    ACKNOWLEDGED = "acknowledged"


class Recorded(StrEnum):
    """What recording a control request did."""

    NEW = "new"
    # The request id was recorded before: nothing was added, the first answer stands.
    DUPLICATE = "duplicate"
    # The job has ended (its `done`, or a failure): nothing was recorded.
    ENDED = "ended"
    # The job has no event yet (unknown, or expired): nothing was recorded.
    UNKNOWN_JOB = "unknown_job"
    # The request id was first used by this sender for the other kind: nothing was recorded.
    KIND_CONFLICT = "kind_conflict"
    # A cancel when the job has one: the first cancel's receipt is the answer.
    CANCELLED_BEFORE = "cancelled_before"
    # Too many messages or bytes wait for the worker: nothing was recorded, retry later.
    FULL = "full"
    # The sender posts to this job faster than its rate: nothing was recorded, retry later.
    RATE_LIMITED = "rate_limited"
    # The job has had as many messages as it may hold: nothing was recorded.
    EXHAUSTED = "exhausted"


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """A valid control request: the job, what is asked, the client's request id (its
    idempotency key) and the body as compact JSON (an object)."""

    domain: str
    job_id: str
    kind: ControlKind
    request_id: str
    body: bytes
    # Who sent it (a namespace the gateway derives from the credential): request ids are
    # this sender's own, so one viewer cannot take another's.
    sender: str = ANONYMOUS


@dataclass(frozen=True, slots=True)
class ControlReceipt:
    """The answer to a control request: what recording did, and the message it names (the
    first one for a duplicate or a second cancel; none when nothing was recorded), and for a
    refusal that waiting may lift, how long to wait."""

    outcome: Recorded
    request_id: str
    message_id: str | None = None
    number: int | None = None
    kind: ControlKind | None = None
    retry_after_s: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """A recorded control message as a worker (or the console) reads it: its id in the job's
    control log, its number (1, 2, ... per job), what it asks, its body and its state."""

    domain: str
    job_id: str
    message_id: str
    number: int
    kind: ControlKind
    request_id: str
    body: Mapping[str, Any]
    state: ControlState = ControlState.RECORDED
    deliveries: int = 0


@dataclass(frozen=True, slots=True)
class PendingControls:
    """What a worker is handed: its job's unacknowledged messages in order, the control log's
    last id read (to wait after), and whether the job has ended (then nothing is handed)."""

    messages: tuple[ControlMessage, ...] = ()
    last_id: str = "0-0"
    ended: bool = False
    # The read stopped at its limit: more may follow `last_id` at once.
    more: bool = False


@dataclass(frozen=True, slots=True)
class ControlSummary:
    """A recorded message as the console lists it: no more of its body than a preview, and
    none once acknowledged (its body is not kept then)."""

    number: int
    message_id: str
    kind: ControlKind
    request_id: str
    state: ControlState
    deliveries: int
    size: int
    preview: str | None


@dataclass(frozen=True, slots=True)
class ControlLogPage:
    """A page of a job's control messages (the latest ones) with the job's totals."""

    total: int = 0
    waiting: int = 0
    waiting_bytes: int = 0
    messages: tuple[ControlSummary, ...] = ()


@dataclass(frozen=True, slots=True)
class ControlLimits:
    """The bounds on one job's control messages.

    `max_waiting` messages and `max_waiting_bytes` of bodies may wait for the worker (what it
    acknowledged no longer counts); `max_messages` may be recorded in the job's lifetime; each
    sender may record `burst` at once and `rate_per_s` a second after that. A cancel passes
    them all (a job holds at most one)."""

    max_waiting: int = 100
    max_waiting_bytes: int = 256 * 1024
    max_messages: int = 1000
    rate_per_s: float = 5.0
    burst: int = 20


@dataclass(frozen=True, slots=True)
class RateBucket:
    """A sender's token bucket for one job: tokens left at `at_ms`."""

    tokens: float
    at_ms: int

    def encode(self) -> str:
        return f"{self.tokens:.4f} {self.at_ms}"

    @classmethod
    def decode(cls, text: str | None) -> RateBucket | None:
        if not text:
            return None
        tokens, _, at_ms = text.partition(" ")
        return cls(float(tokens), int(at_ms))


@dataclass(frozen=True, slots=True)
class FirstMessage:
    """A recorded message a new request may answer with: its id, number and kind."""

    message_id: str
    number: int
    kind: ControlKind

    def encode(self) -> str:
        return f"{self.message_id} {self.number} {self.kind.value}"

    @classmethod
    def decode(cls, text: str | None) -> FirstMessage | None:
        if not text:
            return None
        message_id, number, kind = text.split(" ")
        return cls(message_id, int(number), ControlKind(kind))


@dataclass(frozen=True, slots=True)
class ControlLog:
    """What a store holds of a job's control messages when a request comes: all that
    `admit` needs, read in one atomic step; `version` fences the write that follows."""

    known: bool = False
    ended: bool = False
    version: int = 0
    count: int = 0
    waiting: int = 0
    waiting_bytes: int = 0
    first: FirstMessage | None = None
    cancel: FirstMessage | None = None
    bucket: RateBucket | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """What `admit` decided: the receipt when nothing is to be written; else the new
    message's number and the sender's bucket after it (None: unchanged)."""

    refused: ControlReceipt | None = None
    number: int = 0
    bucket: RateBucket | None = None


def admit(
    request: ControlRequest, log: ControlLog, limits: ControlLimits, now_ms: int
) -> Admission:
    """Decide a control request against its job's log, in this order.

    - A request id this sender used before answers the first receipt (even after the end),
      unless it was for the other kind (`KIND_CONFLICT`).
    - A job without any event is `UNKNOWN_JOB`; one that ended is `ENDED`.
    - A cancel when the job has one answers that one (`CANCELLED_BEFORE`); else it is
      recorded whatever the limits: a cancel always gets through.
    - An input is `EXHAUSTED` past `max_messages`, `FULL` past `max_waiting` or
      `max_waiting_bytes`, `RATE_LIMITED` past its sender's rate; else it is recorded.
    """
    rid = request.request_id
    if log.first is not None:
        first = log.first
        if first.kind is not request.kind:
            detail = f"request id {rid!r} was used for {first.kind.value}, not {request.kind.value}"
            return Admission(ControlReceipt(Recorded.KIND_CONFLICT, rid, detail=detail))
        return Admission(
            ControlReceipt(Recorded.DUPLICATE, rid, first.message_id, first.number, first.kind)
        )
    if not log.known:
        return Admission(ControlReceipt(Recorded.UNKNOWN_JOB, rid))
    if log.ended:
        return Admission(ControlReceipt(Recorded.ENDED, rid))
    if request.kind is ControlKind.CANCEL:
        if log.cancel is not None:
            first = log.cancel
            return Admission(
                ControlReceipt(
                    Recorded.CANCELLED_BEFORE, rid, first.message_id, first.number, first.kind
                )
            )
        return Admission(number=log.count + 1)
    if log.count >= limits.max_messages:
        detail = f"the job has had {log.count} control messages (max {limits.max_messages})"
        return Admission(ControlReceipt(Recorded.EXHAUSTED, rid, detail=detail))
    size = len(request.body)
    if log.waiting >= limits.max_waiting or log.waiting_bytes + size > limits.max_waiting_bytes:
        detail = (
            f"{log.waiting} messages of {log.waiting_bytes} bytes wait for the job's worker "
            f"(max {limits.max_waiting} and {limits.max_waiting_bytes} bytes)"
        )
        return Admission(ControlReceipt(Recorded.FULL, rid, retry_after_s=1, detail=detail))
    tokens = _refilled(log.bucket, limits, now_ms)
    if tokens < 1:
        wait_s = max(1, math.ceil((1 - tokens) / limits.rate_per_s))
        detail = f"more than {limits.burst} messages at once or {limits.rate_per_s:g} a second"
        return Admission(
            ControlReceipt(Recorded.RATE_LIMITED, rid, retry_after_s=wait_s, detail=detail)
        )
    return Admission(number=log.count + 1, bucket=RateBucket(tokens - 1, now_ms))


def _refilled(bucket: RateBucket | None, limits: ControlLimits, now_ms: int) -> float:
    if bucket is None:
        return float(limits.burst)
    elapsed_s = max(0, now_ms - bucket.at_ms) / 1000
    return min(float(limits.burst), bucket.tokens + elapsed_s * limits.rate_per_s)


def control_request(
    domain: str,
    job_id: str,
    kind: ControlKind,
    raw: bytes,
    idempotency_key: str | None,
    *,
    default_id: str | None = None,
    sender: str = ANONYMOUS,
) -> ControlRequest:
    """Validate a control request's body and request id.

    - The body is a JSON object of at most `MAX_CONTROL_BODY_BYTES` (empty for a cancel: `{}`),
      before and after compacting, that the router routes as a result (`parse_result`).
    - An input carries at least one member besides `request_id`.
    - The request id is the `Idempotency-Key` header or the body's `request_id`, 1-128
      characters of [A-Za-z0-9_.:-]; when both are given they are the same; `default_id`
      when neither is (a call that cannot be retried safely: the reference's).
    """
    if len(raw) > MAX_CONTROL_BODY_BYTES:
        raise InvalidControl(f"the body has {len(raw)} bytes (max {MAX_CONTROL_BODY_BYTES})")
    body: Any = {}
    if raw.strip():
        try:
            body = parse_result(raw.decode())
        except UnicodeDecodeError:
            raise InvalidControl("the body is not UTF-8") from None
        except InvalidResult as error:
            raise InvalidControl(f"the body {error}") from None
    if not isinstance(body, dict):
        raise InvalidControl("the body must be a JSON object")
    given = body.pop(REQUEST_ID_FIELD, None)
    if given is not None and not isinstance(given, str):
        raise InvalidControl("request_id must be a string")
    if idempotency_key is not None and given is not None and idempotency_key != given:
        raise InvalidControl("the Idempotency-Key header and request_id differ")
    request_id = idempotency_key if idempotency_key is not None else given
    request_id = default_id if request_id is None else request_id
    if request_id is None:
        raise InvalidControl("an Idempotency-Key header or a request_id field is required")
    if REQUEST_ID.fullmatch(request_id) is None:
        raise InvalidControl("the request id must be 1-128 characters of [A-Za-z0-9_.:-]")
    if kind is ControlKind.INPUT and not body:
        raise InvalidControl("an input needs at least one member besides request_id")
    compact = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if len(compact) > MAX_CONTROL_BODY_BYTES:
        # Compacting can lengthen numbers (1e9 is written 1000000000.0).
        raise InvalidControl(
            f"the body has {len(compact)} bytes once compacted (max {MAX_CONTROL_BODY_BYTES})"
        )
    return ControlRequest(domain, job_id, kind, request_id, compact, sender)


def lifecycle_fields(
    request: ControlRequest, message_id: str, number: int, ts: str
) -> dict[str, str]:
    """The stream entry that announces a recorded control message in the job's events: its
    seq is the message's number, judged apart from stages and tokens (`judge_lifecycle`), so
    writing it again adds nothing."""
    return {
        "job_id": request.job_id,
        "stage": request.kind.stage,
        "status": request.kind.status,
        "seq": str(number),
        "ts": ts,
        REQUEST_ID_FIELD: request.request_id,
        "control_id": message_id,
        "result": request.body.decode(),
    }


def lifecycle_event_id(last_id: int | None) -> int:
    """A lifecycle event's id: the next in the job's sequence (its seq is not an id: it
    numbers the job's control messages, or is the reference's fixed `needs_input` seq)."""
    return 0 if last_id is None else last_id + 1


def has_ended(state: Mapping[str, Any] | None) -> bool:
    """Whether a job's state (its latest applied stage event) is its end: `done`, or a
    failure (`ends_job`); as the gateway ends a stream on it."""
    if state is None:
        return False
    return ends_job(state.get("stage"), state.get("status"))
