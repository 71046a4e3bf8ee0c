"""Looking a job up: its state snapshot and history, as the router stored them, and its
control messages."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.application.domains import family_named
from eco_router.application.port_values import JobView
from eco_router.application.ports import ControlStore, StateStore
from eco_router.domain.control import ControlLogPage
from eco_router.domain.parsing import JOB_ID_PATTERN
from eco_router.domain.streams import StreamFamily


class LookUpJob:
    """A job's stored state and history.

    - The domain must be configured (`UnknownDomain`) and the job id well formed (`ValueError`),
      so a lookup never reads a key the router could not have written.
    - An unknown or expired job has no state and an empty history.
    """

    def __init__(self, *, store: StateStore, families: Sequence[StreamFamily]) -> None:
        self._store = store
        self._families = tuple(families)

    async def __call__(self, domain: str, job_id: str) -> JobView:
        family_named(self._families, domain)
        if JOB_ID_PATTERN.fullmatch(job_id) is None:
            raise ValueError("job_id must be 1-128 characters of [A-Za-z0-9_.:-]")
        return await self._store.view(domain, job_id)


# The latest messages a lookup shows.
PAGE = 50


class ListJobControls:
    """A page of a job's control messages (cancel, input), the latest first, with their
    state: recorded, delivered (how many times) or acknowledged, their size and the start of
    their body while it is kept; and the job's totals.

    - The same checks as `LookUpJob`: a configured domain, a well-formed job id.
    - A job without any (or whose control keys expired) has none.
    - Bounded: `PAGE` messages and `PREVIEW_BYTES` of each body, whatever the job holds.
    """

    def __init__(self, *, store: ControlStore, families: Sequence[StreamFamily]) -> None:
        self._store = store
        self._families = tuple(families)

    async def __call__(self, domain: str, job_id: str, *, limit: int = PAGE) -> ControlLogPage:
        family_named(self._families, domain)
        if JOB_ID_PATTERN.fullmatch(job_id) is None:
            raise ValueError("job_id must be 1-128 characters of [A-Za-z0-9_.:-]")
        return await self._store.messages(domain, job_id, limit=limit)
