"""Finding a configured stream family by its domain, for operator requests."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.domain.streams import StreamFamily


class UnknownDomain(LookupError):
    """A request named a domain no configured stream family has."""


def family_named(families: Sequence[StreamFamily], domain: str) -> StreamFamily:
    """The family whose domain is `domain`; `UnknownDomain` listing the known ones otherwise."""
    for family in families:
        if family.domain == domain:
            return family
    known = ", ".join(f.domain for f in families)
    raise UnknownDomain(f"unknown domain {domain[:64]!r} (configured: {known})")
