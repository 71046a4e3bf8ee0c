"""What a producer may publish: statuses, the stage plan and the deterministic seq rule."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from eco_router.domain.errors import DomainError
from eco_router.domain.event import TOKEN_STAGE
from eco_router.domain.parsing import JOB_ID_PATTERN, MAX_SEQ

DEFAULT_STAGES = ("vision", "rule", "answer", "reward")
STAGE_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
QUEUED_STAGE = "queued"
DONE_STAGE = "done"
# The reference chat worker's pause for its user: stage `needs_input`, status `waiting`.
NEEDS_INPUT_STAGE = "needs_input"
# Where a call that looks like a token is sent: tokens have their own seqs and idempotency.
TOKEN_API = (
    "publish answer text with publish_tokens(job_id, deltas) or "
    "publish_token(job_id, content, seq=...)"
)


class Status(StrEnum):
    """The statuses a job-progress event can carry."""

    QUEUED = "queued"
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    DONE = "done"
    # The job waits for its user (the reference writes it on the stage `needs_input`); it is
    # not over, and the stream stays open.
    WAITING = "waiting"
    # A job that stopped because a viewer cancelled it: its `done` says so.
    CANCELLED = "cancelled"
    # A token's status; only the token API writes it.
    STREAMING = "streaming"


_STAGE_OFFSET = {Status.STARTED: 0, Status.COMPLETED: 1, Status.FAILED: 2}
# The reference design's vocabulary: its pseudo-stages `queued` and `done` with a plain status.
_RESERVED_STAGE_STATUS = {
    (QUEUED_STAGE, Status.STARTED): Status.QUEUED,
    (DONE_STAGE, Status.COMPLETED): Status.DONE,
}


def job_status(stage: str, status: Status) -> Status:
    """What an event says of the job: ("queued", "started") is `queued` and ("done",
    "completed") is `done`, as the reference design writes them; anything else is `status`."""
    return _RESERVED_STAGE_STATUS.get((stage, status), status)


class InvalidProgressEvent(DomainError, ValueError):
    """A progress event refused before anything is written; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class StagePlan:
    """The ordered stages of a domain's pipeline, which fix every event's seq.

    `queued` is 0; the n-th stage (1-based) is n·10 when started, n·10+1 when completed and
    n·10+2 when failed; `done` is (stages+1)·10+1, above everything else. A retried call gets
    the same seq and `failed` never collides with `started`. `queued` and `done` are the
    status `queued` / `done` (any stage name) or the stage `queued` started / `done` completed.

    `waiting` (the job waits for its user; the reference chat worker writes it on the stage
    `needs_input`) is (stages+2)·10 whatever the stage name, as `queued` and `done` are: 190
    for the reference chat plan of 17 stages, whose `done` is 181. The stage `needs_input`,
    unless the plan has it, takes no other status. Tokens (stage `token`, status
    `streaming`) are numbered apart, from `FIRST_TOKEN_SEQ`, by the token API.
    """

    stages: tuple[str, ...] = DEFAULT_STAGES

    def __post_init__(self) -> None:
        if not self.stages or len(set(self.stages)) != len(self.stages):
            raise InvalidProgressEvent("a stage plan needs distinct, non-empty stage names")

    @property
    def done_seq(self) -> int:
        return (len(self.stages) + 1) * 10 + 1

    @property
    def needs_input_seq(self) -> int:
        return (len(self.stages) + 2) * 10

    def seq_for(self, stage: str, status: Status) -> int:
        refuse_token_vocabulary(stage, status)
        status = job_status(stage, status)
        if status is Status.QUEUED:
            return 0
        if status is Status.DONE:
            return self.done_seq
        if status is Status.CANCELLED:
            if stage != DONE_STAGE:
                raise InvalidProgressEvent(
                    f"status 'cancelled' is for the stage {DONE_STAGE!r}, not {stage!r}"
                )
            return self.done_seq
        if status is Status.WAITING:
            return self.needs_input_seq
        if stage == NEEDS_INPUT_STAGE and stage not in self.stages:
            raise InvalidProgressEvent(
                f"stage {NEEDS_INPUT_STAGE!r} takes status 'waiting', not {status.value!r}"
            )
        if stage in (QUEUED_STAGE, DONE_STAGE) and stage not in self.stages:
            expected = "started" if stage == QUEUED_STAGE else "completed"
            raise InvalidProgressEvent(
                f"stage {stage!r} takes status {expected!r} (or {stage!r}), not {status.value!r}; "
                "report a failure on the stage that failed"
            )
        if stage not in self.stages:
            raise InvalidProgressEvent(
                f"stage {stage!r} is not in the plan {list(self.stages)}; pass seq explicitly"
            )
        return (self.stages.index(stage) + 1) * 10 + _STAGE_OFFSET[status]


@dataclass(frozen=True, slots=True)
class StageEvent:
    """What a producer asks to publish for a job: its stage and status, with an optional
    result, progress (0-100) and seq (else the plan's); `validated` checks it."""

    job_id: str
    stage: str
    status: str
    result: Any = None
    progress: int | None = None
    seq: int | None = None

    def validated(self, plan: StagePlan) -> ProgressEvent:
        """The event as written; every problem raises `InvalidProgressEvent`."""
        return progress_event(
            self.job_id,
            self.stage,
            self.status,
            plan=plan,
            result=self.result,
            progress=self.progress,
            seq=self.seq,
        )


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """A validated event ready to be written to its stream."""

    job_id: str
    stage: str
    status: Status
    seq: int
    progress: int | None = None
    result: Any = None
    has_result: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def idempotency_suffix(self) -> str:
        """What makes two publishes "the same event": the job, the stage and the status.

        The job id's length goes first: ids and stages may contain `:`, and ("a:b", "c") must
        not meet ("a", "b:c"). ("done", "completed") is the same event as ("done", "done"),
        and ("queued", "started") as ("queued", "queued").
        """
        status = job_status(self.stage, self.status)
        return f"{len(self.job_id)}:{self.job_id}:{self.stage}:{status.value}"


def refuse_token_vocabulary(stage: str, status: Status) -> None:
    """A stage event never says `token` or `streaming`: those are a token's, whose seqs and
    idempotency are its own."""
    if stage == TOKEN_STAGE or status is Status.STREAMING:
        raise InvalidProgressEvent(
            f"stage {TOKEN_STAGE!r} and status 'streaming' are for tokens: {TOKEN_API}"
        )


def progress_event(
    job_id: str,
    stage: str,
    status: str,
    *,
    plan: StagePlan,
    result: Any = None,
    has_result: bool = False,
    progress: int | None = None,
    seq: int | None = None,
) -> ProgressEvent:
    """Validate a producer's call; every problem raises `InvalidProgressEvent`."""
    if not isinstance(job_id, str) or JOB_ID_PATTERN.fullmatch(job_id) is None:
        raise InvalidProgressEvent(f"job_id {job_id!r} must be 1-128 characters of [A-Za-z0-9_.:-]")
    try:
        known = Status(status)
    except ValueError:
        raise InvalidProgressEvent(
            f"unknown status {status!r}; expected one of {[s.value for s in Status]}"
        ) from None
    if not isinstance(stage, str) or STAGE_PATTERN.fullmatch(stage) is None:
        raise InvalidProgressEvent(f"stage {stage!r} must be 1-64 characters of [A-Za-z0-9_.-]")
    refuse_token_vocabulary(stage, known)
    if progress is not None and (
        isinstance(progress, bool) or not isinstance(progress, int) or not 0 <= progress <= 100
    ):
        raise InvalidProgressEvent(f"progress {progress!r} must be an integer from 0 to 100")
    if _has_non_finite(result):
        raise InvalidProgressEvent("result must be JSON-encodable (no NaN or infinity)")
    if seq is None:
        seq = plan.seq_for(stage, known)
    elif isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
        raise InvalidProgressEvent(f"seq {seq!r} must be an integer from 0 to {MAX_SEQ}")
    return ProgressEvent(
        job_id=job_id,
        stage=stage,
        status=known,
        seq=seq,
        progress=progress,
        result=result,
        has_result=has_result or result is not None,
    )


def _has_non_finite(value: Any) -> bool:
    """True if a NaN or infinity sits anywhere in `value`: orjson would silently write null."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))  # a self-referencing result is left for orjson to refuse
            stack.extend(item.values() if isinstance(item, dict) else item)
    return False
