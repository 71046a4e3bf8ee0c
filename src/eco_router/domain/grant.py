"""What a checked token opens: the jobs of one domain (or of every domain), some or all of them.

A token is decoded and verified once per request into a `Grant`; each job the request names
is then a set lookup, so a request's cost does not grow with the token's jobs times the
request's jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from eco_router.domain.job_set import Job

# A claim's wildcard: every domain, or every job of the domain.
ANY = "*"


@dataclass(frozen=True, slots=True)
class Grant:
    """The domain a token opens (`ANY`: every one) and its job ids (None: every job)."""

    domain: str
    job_ids: frozenset[str] | None

    @classmethod
    def of(cls, domain: str, job_ids: Iterable[str]) -> Grant:
        """The grant of a token's `domain` and `jobs` claims (`"*"` among the jobs: all)."""
        ids = frozenset(job_ids)
        return cls(domain, None if ANY in ids else ids)

    @classmethod
    def everything(cls) -> Grant:
        """Every job of every domain (no token needed)."""
        return cls(ANY, None)

    def refusal(self, domain: str, job_id: str) -> str | None:
        """Why the grant does not open the job; None when it does."""
        if self.domain not in (ANY, domain):
            return "the token does not grant this domain"
        if self.job_ids is not None and job_id not in self.job_ids:
            return "the token does not grant this job"
        return None

    def first_refusal(self, jobs: Iterable[Job]) -> str | None:
        """Why the grant does not open the first of `jobs` it does not open; None: it opens
        them all."""
        for domain, job_id in jobs:
            if (reason := self.refusal(domain, job_id)) is not None:
                return reason
        return None

    def finite_jobs(self) -> list[Job] | None:
        """The jobs the grant names, by id; None when it names no finite set (a wildcard)."""
        if self.domain == ANY or self.job_ids is None:
            return None
        return [(self.domain, job_id) for job_id in sorted(self.job_ids)]
