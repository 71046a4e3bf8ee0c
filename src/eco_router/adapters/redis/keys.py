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


@dataclass(frozen=True, slots=True)
class GroupKeys:
    """The keys of a consumer group's coordination: live routers, and per shard its lease
    and fencing epoch (hash-tagged with the stream's name, so both share its cluster slot)."""

    group: str

    @property
    def routers(self) -> str:
        return f"eco-router:{self.group}:routers"

    def lease(self, stream: str) -> str:
        return f"eco-router:{self.group}:lease:{{{stream}}}"

    def epoch(self, stream: str) -> str:
        return f"eco-router:{self.group}:epoch:{{{stream}}}"


@dataclass(frozen=True, slots=True)
class DeadLetterKeys:
    """The markers of the entries a dead-letter stream holds, hash-tagged with the stream's
    name (a key without a tag hashes its whole name), so both share its cluster slot."""

    stream: str

    def marker(self, source_stream: str, entry_id: str) -> str:
        return f"eco-router:dead-lettered:{{{self.stream}}}:{source_stream}:{entry_id}"
