"""Values that cross the ports: deliveries, encoded events, dead letters, shard statistics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from eco_router.application.errors import PermanentError
from eco_router.domain.event import JobEvent
from eco_router.domain.ownership import Lease
from eco_router.domain.rejection import RejectReason
from eco_router.domain.sse import GatewayEvent, live_frame
from eco_router.domain.streams import StreamFamily
from eco_router.domain.verdict import Judgement


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


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """New entries of the shards read, in id order per shard.

    `gaps` are the shards where an entry after the reader's last one is pending at another
    consumer: a router that read it after losing the shard. When the read drained every
    shard, `marks` holds each shard's last entry id (the next read blocks; a source that
    cannot block on the server waits for an append after them).
    `broken` are the shards the server refused to read for good (nothing was read of them);
    `regrouped` the shards whose group had vanished, created again at the id given. `starts`
    tells, per shard it brought entries of, where the read began, for the apply to check
    (none when the read looked behind: it checked them itself).
    """

    deliveries: list[Delivery]
    gaps: frozenset[str] = frozenset()
    marks: Mapping[str, str] = field(default_factory=dict)
    broken: Mapping[str, PermanentError] = field(default_factory=dict)
    regrouped: Mapping[str, str] = field(default_factory=dict)
    starts: Mapping[str, ReadStart] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReadStart:
    """Where a consumer's read of a shard began (`after`, the last entry it had read there)
    and the first entry it brought: the apply checks that nothing came between."""

    consumer: str
    after: str
    first: str


def read_starts(
    consumer: str, after: Mapping[str, str], deliveries: Sequence[Delivery]
) -> dict[str, ReadStart]:
    """The `ReadStart` of each shard of `after` that `deliveries` (a read's) brought entries of."""
    return {
        stream: ReadStart(consumer, after[stream], first)
        for stream, first in first_ids(deliveries).items()
        if stream in after
    }


def first_ids(deliveries: Sequence[Delivery]) -> dict[str, str]:
    """The id of each stream's first entry among `deliveries` (which are in id order)."""
    first: dict[str, str] = {}
    for delivery in deliveries:
        first.setdefault(delivery.stream, delivery.entry_id)
    return first


def drained_marks(
    deliveries: Sequence[Delivery], after: Mapping[str, str], count: int
) -> dict[str, str]:
    """When no shard gave `count` entries (the read took all there was), each shard's last
    entry id: the last one read, else `after`'s; else none (there is more to read)."""
    read: dict[str, int] = {}
    marks = dict(after)
    for delivery in deliveries:
        read[delivery.stream] = read.get(delivery.stream, 0) + 1
        marks[delivery.stream] = delivery.entry_id
    return {} if any(n >= count for n in read.values()) else marks


@dataclass(frozen=True, slots=True)
class Applied:
    """The judgements of a batch's events, in order; events of `fenced` shards were not judged
    (None): another router holds their shard now; nor were those of `gaps`, shards where an
    entry read by someone else (or by a read whose reply was lost) comes before the read's."""

    judgements: list[Judgement | None]
    fenced: frozenset[str] = frozenset()
    gaps: frozenset[str] = frozenset()
    # Per event, the fields the router puts first in its JSON when it is published (its
    # event id...: `domain.text.stamp`); None when it is not published.
    stamps: list[bytes | None] = field(default_factory=list)

    def stamp_of(self, index: int) -> bytes | None:
        return self.stamps[index] if index < len(self.stamps) else None


@dataclass(frozen=True, slots=True)
class GroupView:
    """The live routers (name → lease expiry) and the shard leases of a group at `now_ms`,
    on the lease store's clock."""

    now_ms: int
    routers: Mapping[str, int]
    leases: Mapping[str, Lease]

    def owners(self) -> dict[str, str]:
        return {stream: lease.owner for stream, lease in self.leases.items()}


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
class StoredDeadLetter:
    """A dead-letter entry read back: where it came from, why, and its original fields."""

    dlq_id: str
    stream: str
    entry_id: str
    reason: str
    detail: str
    deliveries: int
    dead_at_ms: int
    fields: dict[bytes, bytes]


@dataclass(frozen=True, slots=True)
class Replayed:
    """One dead letter put back: its dead-letter id, the stream and the new entry id."""

    dlq_id: str
    stream: str
    new_id: str


@dataclass(frozen=True, slots=True)
class DeadLetterTally:
    """How many dead letters a family's stream holds, and the newest one's id (None: empty)."""

    count: int
    newest_id: str | None


@dataclass(frozen=True, slots=True)
class ClaimPage:
    """One XAUTOCLAIM-style step: claimed deliveries (gone ones included) and the next cursor;
    a page from cursor `0-0` also tells the group's last delivered id on the shard, read
    before anything was claimed."""

    deliveries: list[Delivery]
    cursor: str
    fenced: bool = False
    last_delivered: str | None = None  # the group's position on the shard, on a first page

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
class ShardCounters:
    """How far one shard has come: entries ever appended, and entries the group has read
    (None when the server cannot tell, e.g. after deletions)."""

    stream: str
    added: int | None
    read: int | None


@dataclass(frozen=True, slots=True)
class JobView:
    """A job's state snapshot and history payloads as stored, oldest first, and the event id
    and write time (entry ms) of its text's last token, when it has a text."""

    state: bytes | None
    history: list[bytes]
    text_last_id: int | None = None
    text_written_ms: int | None = None


@dataclass(frozen=True, slots=True)
class FeedGap:
    """Live events may have been lost (slow client, Pub/Sub reconnect): re-read the history."""

    reason: str


class LiveEvent:
    """One live event on its way to every viewer of its job in this process: what is the
    same for all of them is worked out once, whatever their number.

    Its frame is encoded once; the first viewer written to reads the clock for all of them
    (`now_ms`) and names who reports (`report`); each viewer written to adds one to
    `written`. The feed settles it once every viewer has had it: the viewers written to are
    then reported in one go (counted per event and number of viewers, not per viewer).
    """

    __slots__ = ("event", "frame", "now_ms", "report", "written")

    def __init__(self, event: GatewayEvent) -> None:
        self.event = event
        self.frame = live_frame(event)
        self.now_ms: int | None = None
        self.written = 0
        self.report: Callable[[LiveEvent], None] | None = None

    def settle(self) -> None:
        """Every viewer has had it: report those written to, once."""
        if self.written and self.report is not None:
            self.report(self)


@dataclass(frozen=True, slots=True)
class FeedClosed:
    """The process is shutting down: end the stream so the client resumes on another one."""
