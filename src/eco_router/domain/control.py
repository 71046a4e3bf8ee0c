"""Control messages a job's viewers send its worker (cancel, input), and the lifecycle events
that announce them in the job's event sequence."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from eco_router.domain.errors import DomainError
from eco_router.domain.event import CANCEL_REQUESTED, INPUT_RECEIVED, ends_job

# A control body is a short JSON object (a reply, a reason); a bigger one is a result to send
# by reference. With the entry's other fields it stays below the 8 KiB event limit.
MAX_CONTROL_BODY_BYTES = 4096
REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
REQUEST_ID_FIELD = "request_id"


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


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """A valid control request: the job, what is asked, the client's request id (its
    idempotency key) and the body as compact JSON (an object)."""

    domain: str
    job_id: str
    kind: ControlKind
    request_id: str
    body: bytes


@dataclass(frozen=True, slots=True)
class ControlReceipt:
    """The answer to a control request: what recording did, and the message it names (the
    first one for a duplicate; none when the job had ended)."""

    outcome: Recorded
    request_id: str
    message_id: str | None = None
    number: int | None = None
    kind: ControlKind | None = None


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


def control_request(
    domain: str,
    job_id: str,
    kind: ControlKind,
    raw: bytes,
    idempotency_key: str | None,
    *,
    default_id: str | None = None,
) -> ControlRequest:
    """Validate a control request's body and request id.

    - The body is a JSON object of at most `MAX_CONTROL_BODY_BYTES` (empty for a cancel: `{}`).
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
            body = json.loads(raw, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as error:
            raise InvalidControl(f"the body is not JSON: {_first_line(error)}") from error
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
    return ControlRequest(domain, job_id, kind, request_id, compact)


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


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
