"""The verdict on an event given what is known of its job, and the order events are judged in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import groupby
from typing import Protocol

from eco_router.domain.event import JobEvent
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES, TextRecord


class Verdict(StrEnum):
    """What the router does with an entry."""

    NEW = "new"
    DUPLICATE = "duplicate"
    STALE = "stale"
    INVALID = "invalid"
    # A token that does not fit in the job's text (`EVENT_ROUTER_TEXT_MAX_BYTES`).
    TEXT_FULL = "text_full"


class TextFacts(Protocol):
    """What the rules look at of a job's text (`TextRecord`'s fields)."""

    @property
    def attempt(self) -> int | None: ...

    @property
    def last_seq(self) -> int | None: ...

    @property
    def size(self) -> int: ...

    @property
    def full(self) -> bool: ...


class JobFacts(Protocol):
    """What the rules look at of a job (`JobRecord`'s fields): a batch being settled judges
    against its jobs as they stand, without a record built per event."""

    @property
    def last_seq(self) -> int | None: ...

    @property
    def gone(self) -> frozenset[str]: ...

    @property
    def text(self) -> TextFacts: ...

    @property
    def ended(self) -> bool: ...

    @property
    def written_after_end(self) -> bool: ...

    def entry_that_applied(self, seq: int) -> str | None: ...

    def entry_that_marked(self, marker: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What is known of one job: the newest applied seq, which entry applied each seq, and
    which of those entries the stream never held (`gone`: written to a master that was
    demoted and lost them; an entry deleted or trimmed since does not count)."""

    last_seq: int | None = None
    applied_by: Mapping[int, str] | None = None
    gone: frozenset[str] = frozenset()
    text: TextRecord = field(default_factory=TextRecord)
    # Lifecycle events are marked by `JobEvent.lifecycle_marker`, apart from stage seqs.
    lifecycle_by: Mapping[str, str] | None = None
    # The job's latest applied stage event is its end (`ends_job`), and whether a token
    # written after that end was judged already (the router warns of the first only).
    ended: bool = False
    written_after_end: bool = False

    def entry_that_applied(self, seq: int) -> str | None:
        return None if self.applied_by is None else self.applied_by.get(seq)

    def entry_that_marked(self, marker: str) -> str | None:
        return None if self.lifecycle_by is None else self.lifecycle_by.get(marker)


@dataclass(frozen=True, slots=True)
class Judgement:
    """A verdict; for NEW, whether the state must still be applied or only the publish is owed."""

    verdict: Verdict
    apply: bool = False
    # The seq's marker moves to this entry: it carries the publish the gone one owed.
    takes_over: bool = False
    # A token of a newer attempt: the job's text starts again from it.
    restarts: bool = False
    # The token that did not fit: from it on, the attempt's text is full.
    fills: bool = False
    # The first token written after the job's end: stale, and the router warns once.
    first_after_end: bool = False

    @property
    def publish(self) -> bool:
        return self.verdict is Verdict.NEW


NEW_APPLY = Judgement(Verdict.NEW, apply=True)
NEW_REPUBLISH = Judgement(Verdict.NEW, apply=False)
NEW_IN_PLACE_OF_GONE = Judgement(Verdict.NEW, apply=False, takes_over=True)
DUPLICATE = Judgement(Verdict.DUPLICATE)
STALE = Judgement(Verdict.STALE)
NEW_RESTART = Judgement(Verdict.NEW, apply=True, restarts=True)
TEXT_FILLED = Judgement(Verdict.TEXT_FULL, fills=True)
TEXT_FULL = Judgement(Verdict.TEXT_FULL)
STALE_AFTER_END = Judgement(Verdict.STALE, first_after_end=True)


def judge(
    event: JobEvent, record: JobFacts, *, text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES
) -> Judgement:
    """Decide an event's fate: a token by `judge_token`, a lifecycle event by
    `judge_lifecycle`, a stage event by `judge_stage`."""
    if event.is_token:
        return judge_token(event, record, text_max_bytes=text_max_bytes)
    if event.is_lifecycle:
        return judge_lifecycle(event, record)
    return judge_stage(event, record)


def judge_token(event: JobEvent, record: JobFacts, *, text_max_bytes: int) -> Judgement:
    """Decide a token's fate; tokens are numbered apart from stage events, so a stage event
    after tokens is judged by its own seqs only.

    - A token of an older attempt than the text's: STALE (a retried task's late tokens).
    - A token of a newer attempt: the text restarts from it (NEW, restarts).
    - A token at or below the attempt's last seq: DUPLICATE (never applied twice), after
      the job's end too (an entry read again, or written again by a producer's retry).
    - Any other token after the job's end (its latest stage event ends it, `ends_job`):
      STALE, a newer attempt's too: the end ends the text, so the end's check, a late
      viewer's text and a resume from the end stay as the end left them. The first one is
      told apart (`first_after_end`) for the router to warn once for the job.
    - A token that does not fit in `text_max_bytes`: TEXT_FULL, and the attempt's text is
      full from it on (`fills`): later tokens are TEXT_FULL too, so every viewer holds the
      same text, which the terminal event's check marks truncated.
    - Anything else is NEW and is appended.
    """
    text: TextFacts = record.text
    restarts = text.attempt is not None and event.attempt > text.attempt
    if text.attempt is not None and event.attempt < text.attempt:
        return STALE
    if restarts:
        text = TextRecord(attempt=event.attempt)
    if text.last_seq is not None and event.seq <= text.last_seq:
        return DUPLICATE
    if record.ended:
        return STALE if record.written_after_end else STALE_AFTER_END
    if text.full:
        return TEXT_FULL
    if text.size + len(event.content.encode()) > text_max_bytes:
        return Judgement(Verdict.TEXT_FULL, restarts=True, fills=True) if restarts else TEXT_FILLED
    return NEW_RESTART if restarts else NEW_APPLY


def judge_stage(event: JobEvent, record: JobFacts) -> Judgement:
    """Decide a stage event's fate.

    - The entry that applied this (job, seq) comes back: it was not acknowledged, so its
      publish is unconfirmed; publish again without touching the state.
    - Another entry already applied this (job, seq) and the stream holds it, or held it
      before a deletion or trim: DUPLICATE (it was published, or is pending and will be).
    - Another entry applied it that the stream never held: it was read from a demoted master
      and its state write reached the promoted one, so its publish is unconfirmed; this entry
      publishes again in its place and takes over the marker.
    - A seq at or below the newest applied one: STALE.
    - Anything else is NEW and is applied.
    """
    applied_by = record.entry_that_applied(event.seq)
    if applied_by == event.stream_id:
        return NEW_REPUBLISH
    if applied_by is not None:
        return NEW_IN_PLACE_OF_GONE if applied_by in record.gone else DUPLICATE
    if record.last_seq is not None and event.seq <= record.last_seq:
        return STALE
    return NEW_APPLY


def judge_lifecycle(event: JobEvent, record: JobFacts) -> Judgement:
    """Decide a lifecycle event's fate (`cancel_requested`, `input_received`, `needs_input`):
    by its own marker (stage and seq), never by the job's stage seqs, so it is not stale after
    later stages and makes no later stage stale.

    - The entry that applied this marker comes back: publish again without applying.
    - Another entry applied it that the stream holds (or held): DUPLICATE.
    - Another entry applied it that the stream never held: publish again in its place.
    - Anything else is NEW and is applied (to the history, not to the job's state).
    """
    applied_by = record.entry_that_marked(event.lifecycle_marker)
    if applied_by == event.stream_id:
        return NEW_REPUBLISH
    if applied_by is not None:
        return NEW_IN_PLACE_OF_GONE if applied_by in record.gone else DUPLICATE
    return NEW_APPLY


def in_judging_order(events: Iterable[JobEvent]) -> list[JobEvent]:
    """Order a batch so that each job's events are judged in seq order within each run of one
    kind.

    A late older event in the same batch is then applied before the newer one instead of being
    judged stale. Stage events, tokens and lifecycle events are numbered apart, and nothing
    moves across another kind: a stage event written after tokens is routed after them, and a
    token written again after the job's end cannot hand its place to one of the answer's. A
    run of lifecycle events keeps its stream order (they are never stale). Jobs keep their
    first-seen order relative to each other.
    """
    by_job: dict[tuple[str, str], list[JobEvent]] = {}
    for event in events:
        by_job.setdefault(event.job_key, []).append(event)
    ordered: list[JobEvent] = []
    for job_events in by_job.values():
        for kind, group in groupby(job_events, key=_kind):
            run = list(group)
            if kind == _TOKEN:
                run.sort(key=_token_order)
            elif kind == _STAGE:
                run.sort(key=_stage_order)
            ordered.extend(run)
    return ordered


_STAGE, _TOKEN, _LIFECYCLE = range(3)


def _kind(event: JobEvent) -> int:
    if event.is_token:
        return _TOKEN
    return _LIFECYCLE if event.is_lifecycle else _STAGE


def _token_order(event: JobEvent) -> tuple[int, int]:
    return (event.attempt, event.seq)


def _stage_order(event: JobEvent) -> int:
    return event.seq
