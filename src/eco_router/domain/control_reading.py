"""A worker's read of its job's control messages, as decisions without I/O: the blocking and
the asyncio inbox run this same loop, each with its own client."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from eco_router.domain.control import ControlMessage, PendingControls

# A wait is cut in slices this long, so that a job that ended while its worker waited ends
# the wait within one (the end is read with the messages).
WAIT_SLICE_S = 1.0
# Where a job's control log is read from first: its unacknowledged messages start anywhere.
FIRST_ID = "0-0"


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand the job's unacknowledged messages after `after` (a page of them)."""

    after: str


@dataclass(frozen=True, slots=True)
class WaitForMore:
    """Block until a message after `after` is logged, or `timeout_s` passed."""

    after: str
    timeout_s: float


ReadStep = Deliver | WaitForMore


class _Next(enum.Enum):
    DELIVER = enum.auto()
    WAIT = enum.auto()
    DONE = enum.auto()


class ControlReading:
    """One pass over a job's control messages, as `next_step` and `delivered` decide it.

    - The first read starts at the log's beginning: what was acknowledged has left it.
    - A page that was full is followed at once by the next one (`PendingControls.more`).
    - Otherwise the read waits for more, in slices of `WAIT_SLICE_S`, until `timeout_s` from
      `now` is over (None: only the job's end stops it); a deadline already passed still
      reads once, without waiting.
    - Once the job has ended nothing more is handed, and the pass is over.
    """

    def __init__(self, *, timeout_s: float | None, now: float) -> None:
        self._deadline = None if timeout_s is None else now + timeout_s
        self._after = FIRST_ID
        self._next = _Next.DELIVER

    def next_step(self, now: float) -> ReadStep | None:
        """What to do now (None: the pass is over)."""
        if self._next is _Next.DELIVER:
            return Deliver(self._after)
        if self._next is _Next.DONE:
            return None
        left = WAIT_SLICE_S if self._deadline is None else self._deadline - now
        if left <= 0:
            self._next = _Next.DONE
            return None
        self._next = _Next.DELIVER
        return WaitForMore(self._after, min(left, WAIT_SLICE_S))

    def delivered(self, pending: PendingControls) -> tuple[ControlMessage, ...]:
        """What a `Deliver` step read: the messages to hand, in order."""
        if pending.ended:
            self._next = _Next.DONE
            return ()
        self._after = pending.last_id
        self._next = _Next.DELIVER if pending.more else _Next.WAIT
        return pending.messages


@dataclass(slots=True)
class KnownCancels:
    """The jobs a cancel was read for: a cancel is never withdrawn, so each is read at most
    until it is seen."""

    jobs: set[str] = field(default_factory=set)

    def known(self, job_id: str) -> bool:
        return job_id in self.jobs

    def read(self, job_id: str, cancelled: bool) -> bool:
        """What a read of the job's cancel found; remembered when it is one."""
        if cancelled:
            self.jobs.add(job_id)
        return cancelled
