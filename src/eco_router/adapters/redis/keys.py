"""The Redis key layout of a job, shared by the state store and its readers."""

from __future__ import annotations

from dataclasses import dataclass

from eco_router.domain.streams import StreamFamily, hash_tag, slot_named


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The keys one job owns: snapshot, history, applied-markers, its text with what is
    known of it, and its control log with the state of each message; on a tagged shard they
    carry its hash tag (`scan:state:{5461}:job-42`), so they share its slot (and the shard
    stream's: one script may record a control message and append its announcement)."""

    state: str
    history: str
    markers: str
    text_state: str
    text: str
    control: str
    control_state: str

    @classmethod
    def of(cls, domain: str, job_id: str, stream: str = "") -> JobKeys:
        """The keys of `job_id`, routed on `stream`."""
        tag = hash_tag(stream)
        at = f"{{{tag}}}:" if tag else ""
        return cls(
            state=f"{domain}:state:{at}{job_id}",
            history=f"{domain}:history:{at}{job_id}",
            markers=f"{domain}:applied:{at}{job_id}",
            text_state=f"{domain}:text_state:{at}{job_id}",
            text=f"{domain}:text:{at}{job_id}",
            control=f"{domain}:control:{at}{job_id}",
            control_state=f"{domain}:control_state:{at}{job_id}",
        )

    @classmethod
    def in_family(cls, family: StreamFamily, job_id: str) -> JobKeys:
        return cls.of(family.domain, job_id, family.stream_for(job_id))


@dataclass(frozen=True, slots=True)
class GroupKeys:
    """The keys of a consumer group's coordination: live routers, and per shard its lease
    and fencing epoch (hash-tagged like the stream, so both share its cluster slot)."""

    group: str

    @property
    def routers(self) -> str:
        return f"eco-router:{self.group}:routers"

    def lease(self, stream: str) -> str:
        return f"eco-router:{self.group}:lease:{slot_named(stream)}"

    def epoch(self, stream: str) -> str:
        return f"eco-router:{self.group}:epoch:{slot_named(stream)}"


@dataclass(frozen=True, slots=True)
class DeadLetterKeys:
    """The markers of the entries a dead-letter stream holds, hash-tagged with the stream's
    name (a key without a tag hashes its whole name), so both share its cluster slot."""

    stream: str

    def marker(self, source_stream: str, entry_id: str) -> str:
        return f"eco-router:dead-lettered:{{{self.stream}}}:{source_stream}:{entry_id}"


@dataclass(frozen=True, slots=True)
class PresenceKeys:
    """The viewer counts the gateways post: one hash per gateway (job → viewers) and the
    registry of gateways by expiry; all under the namespace's hash tag, so one script may
    take the registry and a gateway's hash together on a Redis Cluster."""

    namespace: str

    @property
    def gateways(self) -> str:
        return f"eco-router:presence:{{{self.namespace}}}:gateways"

    def gateway(self, gateway: str) -> str:
        return f"eco-router:presence:{{{self.namespace}}}:gateway:{gateway}"

    @staticmethod
    def field(domain: str, job_id: str) -> str:
        """A job's field in a gateway's hash (a domain never holds a colon)."""
        return f"{domain}:{job_id}"
