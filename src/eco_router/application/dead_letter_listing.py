"""Listing dead letters for an operator, filtered by reason and by text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eco_router.application.domains import family_named
from eco_router.application.port_values import StoredDeadLetter
from eco_router.application.ports import DeadLetterArchive
from eco_router.domain.streams import StreamFamily


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters an operator asks for: an exact reason, and text found anywhere in
    the letter (ids, stream, reason, detail, field names and values), ignoring case."""

    reason: str | None = None
    text: str | None = None

    def matches(self, letter: StoredDeadLetter) -> bool:
        if self.reason and letter.reason != self.reason:
            return False
        if not self.text:
            return True
        needle = self.text.casefold()
        fields = (part for k, v in letter.fields.items() for part in (k, v))
        haystack = [
            letter.dlq_id,
            letter.stream,
            letter.entry_id,
            letter.reason,
            letter.detail,
            *(part.decode(errors="replace") for part in fields),
        ]
        return any(needle in part.casefold() for part in haystack)


@dataclass(frozen=True, slots=True)
class FoundDeadLetters:
    """One family's matching dead letters, oldest first: the first `count` asked for of the
    `matching` ones among the `scanned` oldest of its `total`."""

    domain: str
    total: int
    scanned: int
    letters: list[StoredDeadLetter]
    matching: int


class ListDeadLetters:
    """The dead letters an operator looks at.

    - One domain, or every configured one in configuration order; an unknown domain is
      `UnknownDomain`.
    - Only the oldest `scan` letters of each family are read (the stream may be long); of
      those, the first `count` that match the filter are returned, with how many match (what
      a replay of all matching puts back) and the family's total.
    """

    def __init__(self, *, archive: DeadLetterArchive, families: Sequence[StreamFamily]) -> None:
        self._archive = archive
        self._families = tuple(families)

    async def __call__(
        self,
        domain: str | None = None,
        *,
        matching: DeadLetterFilter = DeadLetterFilter(),
        count: int = 100,
        scan: int = 1000,
    ) -> list[FoundDeadLetters]:
        families = self._families if domain is None else (family_named(self._families, domain),)
        found = []
        for family in families:
            tally = await self._archive.tally(family)
            letters = await self._archive.oldest(family, count=scan)
            chosen = [letter for letter in letters if matching.matches(letter)]
            found.append(
                FoundDeadLetters(
                    family.domain, tally.count, len(letters), chosen[:count], len(chosen)
                )
            )
        return found
