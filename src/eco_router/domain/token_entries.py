"""What a producer may write of a job's answer text: token entries, their seqs, and when
deltas share an entry."""

from __future__ import annotations

import math
from dataclasses import dataclass

from eco_router.domain.event import FIRST_TOKEN_SEQ, TOKEN_STAGE
from eco_router.domain.parsing import JOB_ID_PATTERN, MAX_SEQ
from eco_router.domain.progress import STAGE_PATTERN, InvalidProgressEvent

# Deltas of a model arrive every 10-50 ms: 50 ms merges a few of them into one entry, so a
# fast model costs fewer entries, while a reader still sees text move 20 times a second.
DEFAULT_COALESCE_MS = 50.0


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One validated token: a delta of the job's text, at its seq in its attempt."""

    job_id: str
    seq: int
    content: str
    node: str | None = None
    attempt: int = 0

    @property
    def idempotency_suffix(self) -> str:
        """What makes two writes "the same token": the job, the attempt and the seq.

        The job id's length goes first, as for stage events; the attempt and the seq are
        digits where a stage event's marker ends with its status, so the two never meet.
        """
        return f"{len(self.job_id)}:{self.job_id}:{TOKEN_STAGE}:{self.attempt}:{self.seq}"


@dataclass(frozen=True, slots=True)
class TokenRun:
    """Where one run of tokens goes: the job, the graph node, the attempt and the first seq;
    its n-th entry (from 0) is `first_seq + n`."""

    job_id: str
    node: str | None = None
    attempt: int = 0
    first_seq: int = FIRST_TOKEN_SEQ

    def entry(self, index: int, content: str) -> TokenEntry:
        """The run's `index`-th entry; refused past the largest seq."""
        seq = self.first_seq + index
        if seq > MAX_SEQ:
            raise InvalidProgressEvent(f"token seq {seq} is above {MAX_SEQ}")
        return TokenEntry(self.job_id, seq, content, self.node, self.attempt)


def token_run(
    job_id: str,
    *,
    node: str | None = None,
    attempt: int = 0,
    first_seq: int = FIRST_TOKEN_SEQ,
) -> TokenRun:
    """Validate a run's settings before any delta is read; problems raise
    `InvalidProgressEvent`."""
    if not isinstance(job_id, str) or JOB_ID_PATTERN.fullmatch(job_id) is None:
        raise InvalidProgressEvent(f"job_id {job_id!r} must be 1-128 characters of [A-Za-z0-9_.:-]")
    if node is not None and (not isinstance(node, str) or STAGE_PATTERN.fullmatch(node) is None):
        raise InvalidProgressEvent(f"node {node!r} must be 1-64 characters of [A-Za-z0-9_.-]")
    if not _is_integer(attempt) or not 0 <= attempt <= MAX_SEQ:
        raise InvalidProgressEvent(f"attempt {attempt!r} must be an integer from 0 to {MAX_SEQ}")
    if not _is_integer(first_seq) or not 0 <= first_seq <= MAX_SEQ:
        raise InvalidProgressEvent(f"seq {first_seq!r} must be an integer from 0 to {MAX_SEQ}")
    return TokenRun(job_id, node, attempt, first_seq)


def token_entry(
    job_id: str, content: str, *, seq: int, node: str | None = None, attempt: int = 0
) -> TokenEntry:
    """Validate one token a worker numbered itself."""
    if not isinstance(content, str):
        raise InvalidProgressEvent(f"content must be a str, not {type(content).__name__}")
    return token_run(job_id, node=node, attempt=attempt, first_seq=seq).entry(0, content)


@dataclass(frozen=True, slots=True)
class PendingText:
    """Deltas merged into the next entry, not written yet: their text, what they cost of the
    entry's budget, and when the first of them arrived."""

    text: str
    cost: int
    opened_at: float


@dataclass(frozen=True, slots=True)
class Coalescing:
    """When deltas share an entry: those arriving less than `window_s` after the pending
    entry's first delta join it, while its cost stays within `max_cost` (the entry must still
    pass the router's size limit). A delta is never split; `window_s` 0 gives each delta its
    own entry."""

    window_s: float
    max_cost: int

    def add(
        self, pending: PendingText | None, delta: str, *, cost: int, now: float
    ) -> tuple[PendingText, str | None]:
        """The pending entry once `delta` (costing `cost`) arrived at `now`, and the text of
        the entry it closed, to be written now, if any."""
        if (
            pending is not None
            and now - pending.opened_at < self.window_s
            and pending.cost + cost <= self.max_cost
        ):
            return PendingText(pending.text + delta, pending.cost + cost, pending.opened_at), None
        closed = None if pending is None else pending.text
        return PendingText(delta, cost, now), closed

    def due_at(self, pending: PendingText) -> float:
        """When the pending entry is written even if no delta follows."""
        return pending.opened_at + self.window_s


def coalescing(coalesce_ms: float, *, max_cost: int) -> Coalescing:
    """Validate a window in milliseconds (a finite number, at least 0)."""
    if (
        isinstance(coalesce_ms, bool)
        or not isinstance(coalesce_ms, (int, float))
        or not math.isfinite(coalesce_ms)
        or coalesce_ms < 0
    ):
        raise InvalidProgressEvent(f"coalesce_ms {coalesce_ms!r} must be a number of at least 0")
    return Coalescing(coalesce_ms / 1000, max(max_cost, 1))


@dataclass(frozen=True, slots=True)
class TokensPublished:
    """What a run of tokens wrote: its entries, the seqs they took and the text they carry
    (in characters and UTF-8 bytes). The next run of the same attempt starts at `next_seq`."""

    entries: int
    first_seq: int
    last_seq: int | None
    characters: int
    text_bytes: int

    @property
    def next_seq(self) -> int:
        return self.first_seq if self.last_seq is None else self.last_seq + 1


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
