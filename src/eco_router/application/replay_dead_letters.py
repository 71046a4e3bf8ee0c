"""Putting dead letters back on their stream once the cause is fixed."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.application.dead_letter_listing import DeadLetterFilter
from eco_router.application.domains import family_named
from eco_router.application.port_values import Replayed
from eco_router.application.ports import DeadLetterArchive
from eco_router.domain.streams import StreamFamily


class SelectionChanged(Exception):
    """The letters matching a filter are not the number the operator confirmed."""


class ReplayDeadLetters:
    """Replays chosen dead letters of one domain.

    - Either by id (every id must be there, else `LookupError` naming it and nothing is
      replayed) or every letter matching a filter among the oldest `scan` (none matching
      replays nothing). With `expected`, a filter must match exactly that many letters,
      else `SelectionChanged` and nothing is replayed: what was confirmed is what is done.
    - Each letter goes back byte for byte under a new entry id and leaves the dead-letter
      stream; the router judges it again, and its dedup absorbs a replay repeated after an
      interruption.
    """

    def __init__(self, *, archive: DeadLetterArchive, families: Sequence[StreamFamily]) -> None:
        self._archive = archive
        self._families = tuple(families)

    async def __call__(
        self,
        domain: str,
        *,
        ids: Sequence[str] | None = None,
        matching: DeadLetterFilter | None = None,
        scan: int = 1000,
        expected: int | None = None,
    ) -> list[Replayed]:
        family = family_named(self._families, domain)
        if (ids is None) == (matching is None):
            raise ValueError("give dead-letter ids or a filter, not both and not neither")
        if ids is not None:
            if not ids:
                raise ValueError("no dead-letter id given")
            return await self._archive.replay(family, list(dict.fromkeys(ids)))
        assert matching is not None
        letters = await self._archive.oldest(family, count=scan)
        chosen = [letter.dlq_id for letter in letters if matching.matches(letter)]
        if expected is not None and len(chosen) != expected:
            raise SelectionChanged(
                f"{len(chosen)} dead letters of {domain} match now, not the {expected}"
                " confirmed; nothing replayed"
            )
        return await self._archive.replay(family, chosen) if chosen else []
