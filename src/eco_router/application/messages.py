"""Values that cross the ports: deliveries, encoded events, dead letters, shard statistics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eco_router.domain.event import JobEvent
from eco_router.domain.rejection import RejectReason
from eco_router.domain.streams import StreamFamily


@dataclass(frozen=True, slots=True)
class Delivery:
    """One stream entry handed to this consumer; `fields` is None when it was deleted unacked."""

    family: StreamFamily
    stream: str
    entry_id: str
    fields: Mapping[bytes, bytes] | None
    delivery_count: int = 1

    @property
    def gone(self) -> bool:
        return self.fields is None


def first_entries(deliveries: Sequence[Delivery]) -> dict[str, str]:
    """The id of the first entry of each stream among `deliveries` (ones with a job id),
    which come in id order within a stream, as every read returns them."""
    first: dict[str, str] = {}
    for d in deliveries:
        if d.fields is not None and d.stream not in first and b"job_id" in d.fields:
            first[d.stream] = d.entry_id
    return first


def entries_of_jobs(
    deliveries: Sequence[Delivery], jobs: set[tuple[str, bytes]]
) -> set[tuple[str, str]]:
    """(stream, entry id) of the `deliveries` whose (stream, job id) is among `jobs`."""
    return {
        (d.stream, d.entry_id)
        for d in deliveries
        if d.fields is not None and (d.stream, d.fields.get(b"job_id")) in jobs
    }


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """A valid event with its wire payload, encoded once for the state store and the channel."""

    event: JobEvent
    payload: bytes


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry that cannot be routed, kept with everything needed to inspect or replay it."""

    delivery: Delivery
    reason: RejectReason
    detail: str


@dataclass(frozen=True, slots=True)
class ClaimPage:
    """One XAUTOCLAIM-style step: claimed deliveries (gone ones included) and the next cursor."""

    deliveries: list[Delivery]
    cursor: str

    @property
    def wrapped(self) -> bool:
        return self.cursor == "0-0"


@dataclass(frozen=True, slots=True)
class ShardStats:
    """The consumer group's view of one shard."""

    family: StreamFamily
    stream: str
    shard: int
    lag: int | None
    pending: int


@dataclass(frozen=True, slots=True)
class JobView:
    """A job's state snapshot and history payloads as stored, oldest first."""

    state: bytes | None
    history: list[bytes]


@dataclass(frozen=True, slots=True)
class FeedGap:
    """Live events may have been lost (slow client, Pub/Sub reconnect): re-read the history."""

    reason: str


@dataclass(frozen=True, slots=True)
class FeedClosed:
    """The process is shutting down: end the stream so the client resumes on another one."""
