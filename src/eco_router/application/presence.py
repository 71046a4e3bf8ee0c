"""Presence: how many viewers each job has, counted where streams open and close, posted to
a board the gateways share, and read back by the console."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from eco_router.application.domains import family_named
from eco_router.application.ports import JobRef, PresenceBoard
from eco_router.domain.parsing import JOB_ID_PATTERN
from eco_router.domain.streams import StreamFamily

# A gateway's counts lapse after this many posting periods without a post: a post or two may
# fail or come late without its viewers vanishing from the console.
LAPSE_AFTER_PERIODS = 3


class ViewerTally:
    """This process's open job streams, per job and per domain.

    - Changed only when a stream opens or closes, never per event.
    - Remembers which jobs changed since they were last taken (`take_changes`), so posting
      them costs O(jobs changed), and sets `changed` for a poster waiting on it.
    """

    def __init__(self) -> None:
        self._viewers: dict[JobRef, int] = {}
        self._by_domain: Counter[str] = Counter()
        self._jobs_by_domain: Counter[str] = Counter()
        self._changed: set[JobRef] = set()
        self.changed = asyncio.Event()

    def opened(self, domain: str, job_id: str) -> None:
        job = (domain, job_id)
        count = self._viewers.get(job, 0)
        if count == 0:
            self._jobs_by_domain[domain] += 1
        self._viewers[job] = count + 1
        self._by_domain[domain] += 1
        self._mark(job)

    def closed(self, domain: str, job_id: str) -> None:
        job = (domain, job_id)
        count = self._viewers.get(job, 0)
        if count == 0:
            return
        if count == 1:
            del self._viewers[job]
            self._jobs_by_domain[domain] -= 1
        else:
            self._viewers[job] = count - 1
        self._by_domain[domain] -= 1
        self._mark(job)

    def _mark(self, job: JobRef) -> None:
        self._changed.add(job)
        self.changed.set()

    def of(self, domain: str, job_id: str) -> int:
        """The job's open streams here."""
        return self._viewers.get((domain, job_id), 0)

    def by_domain(self) -> dict[str, tuple[int, int]]:
        """Per domain ever watched here: (open streams, jobs with one open at least)."""
        return {d: (n, self._jobs_by_domain[d]) for d, n in self._by_domain.items()}

    def counts(self) -> dict[JobRef, int]:
        """Every job watched here now, with its viewers."""
        return dict(self._viewers)

    def take_changes(self) -> dict[JobRef, int]:
        """The jobs changed since the last take, with their viewers now (0: none left)."""
        changes = {job: self._viewers.get(job, 0) for job in self._changed}
        self._changed.clear()
        self.changed.clear()
        return changes

    def give_back(self, changes: dict[JobRef, int]) -> None:
        """Changes taken but not posted: they are taken again next time."""
        if changes:
            self._changed.update(changes)
            self.changed.set()


class PostViewerCounts:
    """Post this gateway's viewer counts to the board shared by the gateways.

    - Only the jobs changed since the last post are written; each post renews the gateway's
      counts for one TTL even with nothing changed.
    - The first post, and any after the board lost the counts (they lapsed: the board was
      unreachable for longer than the TTL, or restarted), writes them whole, replacing what
      a former process under the same name left.
    - Changes of a failed post are posted next time.
    """

    def __init__(self, *, tally: ViewerTally, board: PresenceBoard, gateway: str) -> None:
        self._tally = tally
        self._board = board
        self.gateway = gateway
        self._whole = True

    async def __call__(self) -> None:
        changes = self._tally.take_changes()
        try:
            if not self._whole and await self._board.post(self.gateway, changes, whole=False):
                return
            self._whole = True
            await self._board.post(self.gateway, self._tally.counts(), whole=True)
            self._whole = False
        except BaseException:
            self._tally.give_back(changes)
            raise

    async def leave(self) -> None:
        """The gateway stops: its counts leave the board at once."""
        await self._board.leave(self.gateway)


@dataclass(frozen=True, slots=True)
class JobViewers:
    """A job's viewers per gateway, and their total."""

    by_gateway: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_gateway.values())


class CountJobViewers:
    """How many viewers a job has now, on every live gateway.

    - The domain must be configured (`UnknownDomain`) and the job id well formed (`ValueError`).
    - A gateway's counts are as of its last post: at most a few seconds old; a gateway that
      stopped posting (killed) drops out a few periods later, one that stopped cleanly at once.
    """

    def __init__(self, *, board: PresenceBoard, families: Sequence[StreamFamily]) -> None:
        self._board = board
        self._families = tuple(families)

    async def __call__(self, domain: str, job_id: str) -> JobViewers:
        family_named(self._families, domain)
        if JOB_ID_PATTERN.fullmatch(job_id) is None:
            raise ValueError("job_id must be 1-128 characters of [A-Za-z0-9_.:-]")
        viewers = await self._board.viewers(domain, job_id)
        return JobViewers(dict(sorted(viewers.items())))
