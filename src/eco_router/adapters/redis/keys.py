"""The Redis key layout of a job, shared by the state store and its readers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The keys one job owns: snapshot, history and applied-markers."""

    state: str
    history: str
    markers: str

    @classmethod
    def of(cls, domain: str, job_id: str) -> JobKeys:
        return cls(
            state=f"{domain}:state:{job_id}",
            history=f"{domain}:history:{job_id}",
            markers=f"{domain}:applied:{job_id}",
        )
