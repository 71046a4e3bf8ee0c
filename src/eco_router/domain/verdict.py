"""The verdict on an event given what is known of its job, and the order events are judged in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from eco_router.domain.event import JobEvent


class Verdict(StrEnum):
    """What the router does with an entry."""

    NEW = "new"
    DUPLICATE = "duplicate"
    STALE = "stale"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What is known of one job: the newest applied seq, which entry applied each seq, and
    which of those entries the stream never held (`gone`: written to a master that was
    demoted and lost them; an entry deleted or trimmed since does not count)."""

    last_seq: int | None = None
    applied_by: Mapping[int, str] | None = None
    gone: frozenset[str] = frozenset()

    def entry_that_applied(self, seq: int) -> str | None:
        return None if self.applied_by is None else self.applied_by.get(seq)


@dataclass(frozen=True, slots=True)
class Judgement:
    """A verdict; for NEW, whether the state must still be applied or only the publish is owed."""

    verdict: Verdict
    apply: bool = False
    # The seq's marker moves to this entry: it carries the publish the gone one owed.
    takes_over: bool = False

    @property
    def publish(self) -> bool:
        return self.verdict is Verdict.NEW


NEW_APPLY = Judgement(Verdict.NEW, apply=True)
NEW_REPUBLISH = Judgement(Verdict.NEW, apply=False)
NEW_IN_PLACE_OF_GONE = Judgement(Verdict.NEW, apply=False, takes_over=True)
DUPLICATE = Judgement(Verdict.DUPLICATE)
STALE = Judgement(Verdict.STALE)


def judge(event: JobEvent, record: JobRecord) -> Judgement:
    """Decide an event's fate.

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


def in_judging_order(events: Iterable[JobEvent]) -> list[JobEvent]:
    """Order a batch so that each job's events are judged in seq order.

    A late older event in the same batch is then applied before the newer one instead of being
    judged stale; jobs keep their first-seen order relative to each other.
    """
    batch = list(events)
    first_seen: dict[tuple[str, str], int] = {}
    for event in batch:
        first_seen.setdefault(event.job_key, len(first_seen))
    return sorted(batch, key=lambda e: (first_seen[e.job_key], e.seq))
