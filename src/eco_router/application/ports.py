"""The ports the use cases depend on; adapters subclass them explicitly."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.token_entries import DEFAULT_COALESCE_MS

# The rest is named in annotations only: an adapter that implements one port (the producer's
# publisher) then imports neither the values of the others nor their modules.
if TYPE_CHECKING:
    from collections.abc import AsyncIterable, Callable, Collection, Iterable, Mapping, Sequence

    from eco_router.application.errors import PermanentError
    from eco_router.application.port_values import (
        Applied,
        ClaimPage,
        DeadLetter,
        DeadLetterTally,
        Delivery,
        EncodedEvent,
        FeedClosed,
        FeedGap,
        GroupView,
        JobView,
        LiveEvent,
        ReadBatch,
        ReadStart,
        Replayed,
        ShardCounters,
        ShardStats,
        StoredDeadLetter,
    )
    from eco_router.domain.control import (
        Admission,
        ControlLog,
        ControlLogPage,
        ControlRequest,
        PendingControls,
    )
    from eco_router.domain.event import JobEvent
    from eco_router.domain.grant import Grant
    from eco_router.domain.ownership import Lease
    from eco_router.domain.progress import StageEvent
    from eco_router.domain.rejection import RejectReason
    from eco_router.domain.sse import Frame, GatewayEvent
    from eco_router.domain.streams import StreamFamily
    from eco_router.domain.text import JobText
    from eco_router.domain.token_entries import TokensPublished
    from eco_router.domain.verdict import Verdict


@runtime_checkable
class EventSource(Protocol):
    """Sharded streams read through one consumer group as one named consumer."""

    @property
    def families(self) -> tuple[StreamFamily, ...]:
        """The stream families this source reads."""
        ...

    async def prepare(self, streams: Collection[str] | None = None) -> dict[str, PermanentError]:
        """Create the group at id 0, with its stream, on `streams` (every shard by default);
        an existing one is fine. Returns the shards the server refused for good (a key of
        the wrong type); `TransientError` if any was refused for now."""
        ...

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        """Up to `count` never-delivered entries of each shard in `after`. `after` is, per
        shard, the last entry this consumer read or took over there. With `look_behind`, an
        entry after it pending at another consumer (or at this one, taken by a read whose
        reply was lost) is reported as a gap; without, the apply of what was read checks that
        (`starts`), and a shard that brought nothing is not looked at. A read that drains
        every shard returns marks (it is `drained`). A shard refused for good is reported
        `broken` and the others are read; a shard whose group vanished gets it back at its
        `after` id, so nothing already read is read again.
        With `block_ms`, a read that finds nothing waits up to that long for an entry, and
        `interrupt` wakes it: it returns what it took, perhaps nothing, never losing it.
        `acks` are acknowledged first, in the same round trip: once the read returns they are
        acked, or refused for good on a shard reported `broken`; when it raises they may or
        may not be (acking again is harmless)."""
        ...

    async def interrupt(self) -> None:
        """Wake the blocking `read_new` in flight; with none, the next one does not block.
        `TransientError` if the server could not be asked (the read ends by itself)."""
        ...

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        """Take over entries idle for `min_idle_ms` from any consumer, counting the delivery,
        while the shard's fencing token is `token` (else a fenced, empty page). From cursor
        `0-0` the page also gives the group's last delivered id, read before claiming. A
        shard without a group has nothing pending: an empty page. `PermanentError` naming the
        stream when the server refuses it for good."""
        ...

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge: the entries leave the pending list for good (one call per stream).
        A stream refused for good raises `PermanentError` naming it, the others acked."""
        ...

    async def shard_stats(self) -> list[ShardStats]:
        """Lag and pending count of the group on every shard."""
        ...

    async def ping(self) -> None:
        """Raise `TransientError` unless the streams server answers."""
        ...


@runtime_checkable
class StateStore(Protocol):
    """Per-job state snapshot, history, dedup markers and answer text."""

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        """Judge the events in order and apply the NEW ones, all in one atomic step, for the
        shards whose fencing token is still the one in `fence` (every shard of `fence` is
        checked, with or without events) and, for those of `in_order`, whose first entry
        pending in the group after the read's start is the read's first, pending at its
        consumer (else a gap); the other shards' events are left untouched."""
        ...

    async def view(self, domain: str, job_id: str) -> JobView:
        """The job's current snapshot and history, and the id of its text's last token."""
        ...

    async def text(self, domain: str, job_id: str) -> JobText | None:
        """The job's text with its last token's id and seq, read in one atomic step (None:
        the job has no text)."""
        ...


@runtime_checkable
class ControlStore(Protocol):
    """A job's control messages (cancel, input) on the durable streams server: recorded with
    their announcement in the job's events, handed to the job's worker at least once until one
    acknowledges them, never handed once the job has ended."""

    async def control_log(self, request: ControlRequest) -> ControlLog:
        """In one atomic step, what `admit` needs to judge `request`: whether the job has any
        event and has ended, the log's version and counts, the first message of the
        sender's request id, the job's cancel and the sender's rate bucket. Writes nothing."""
        ...

    async def append(
        self, request: ControlRequest, admission: Admission, *, version: int
    ) -> str | None:
        """In one atomic step, if the log is still at `version` and the job has not ended:
        the message joins the job's control log (number `admission.number`, waiting),
        the sender's request id and bucket are kept, and its lifecycle event (seq = the
        number) joins the job's shard stream; its message id. Else None, nothing written.
        Written when it returns, as durably as the server keeps its writes; the keys live
        the state TTL."""
        ...

    async def deliver(
        self, domain: str, job_id: str, *, after: str = "0-0", limit: int = 100
    ) -> PendingControls:
        """The job's unacknowledged messages after message id `after`, in order, each marked
        delivered (its count up): again to every caller until acknowledged; none, and
        `ended`, once the job's state is its end. Costs the same whatever the number of
        acknowledged messages; `more` when `limit` stopped the read."""
        ...

    async def acknowledge(self, domain: str, job_id: str, message_id: str) -> bool:
        """Mark a message acknowledged, never handed again, its body dropped and its place
        among the waiting freed; False for one not held (never recorded, or expired), and
        nothing written. Acknowledging again is True and changes nothing."""
        ...

    async def cancelled(self, domain: str, job_id: str) -> bool:
        """Whether a cancel was recorded for the job (one read)."""
        ...

    async def wait(self, domain: str, job_id: str, *, after: str, timeout_s: float) -> None:
        """Return once a message after id `after` is recorded, or after `timeout_s`."""
        ...

    async def messages(self, domain: str, job_id: str, *, limit: int = 50) -> ControlLogPage:
        """The job's latest `limit` messages in order, each with its state, size and a
        preview of its body while kept, and the job's totals."""
        ...


@runtime_checkable
class Broadcaster(Protocol):
    """Per-job Pub/Sub channels."""

    async def broadcast(self, events: Sequence[EncodedEvent]) -> None:
        """PUBLISH each payload on its job's channel, in order; `BroadcastFailed` if any is lost."""
        ...

    async def ping(self) -> None:
        """Raise `TransientError` unless the Pub/Sub server answers."""
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """Which routers of a group are alive and which one holds each shard (leases with a TTL
    and a fencing token that grows with every new holder)."""

    async def heartbeat(self, router: str, held: Mapping[str, int]) -> GroupView:
        """Mark `router` alive for one TTL and renew each lease in `held` whose fencing token
        is still the given one (even if it lapsed meanwhile); then the group as it is now."""
        ...

    async def acquire(self, stream: str, router: str) -> Lease | None:
        """Take the shard's lease if nobody holds a live one, with a new, higher fencing token;
        None when another router holds it."""
        ...

    async def release(self, stream: str, router: str, token: int) -> None:
        """Give the lease up if it is still held with `token` (a clean hand-over)."""
        ...

    async def leave(self, router: str) -> None:
        """Remove the router from the live set (a clean stop, after releasing its leases)."""
        ...

    async def view(self) -> GroupView:
        """The group as it is now, changing nothing."""
        ...


@runtime_checkable
class DeadLetterSink(Protocol):
    """Where entries that cannot be routed are kept for inspection and replay."""

    async def send(self, letters: Sequence[DeadLetter]) -> None:
        """Store every letter in its family's dead-letter stream before the entry is acked,
        once per entry: a letter for an entry already dead-lettered is dropped (a router that
        died before its ack, or one that paused past its lease, sends it again)."""
        ...


@runtime_checkable
class DeadLetterArchive(Protocol):
    """Dead letters read back, counted, and replayed onto their original stream after a fix."""

    async def oldest(self, family: StreamFamily, *, count: int = 100) -> list[StoredDeadLetter]:
        """The family's oldest `count` dead letters, oldest first."""
        ...

    async def replay(self, family: StreamFamily, dlq_ids: Sequence[str] | None) -> list[Replayed]:
        """Put the letters (all when `dlq_ids` is None) back on their stream byte for byte under
        a new entry id, then delete them; `LookupError` naming an id that is not there (then
        nothing is replayed), `ValueError` for a letter naming a stream outside the family."""
        ...

    async def tally(self, family: StreamFamily) -> DeadLetterTally:
        """How many dead letters the family holds and the newest one's id."""
        ...


@runtime_checkable
class ShardProgress(Protocol):
    """How far each shard has been written and read by the group, as ever-growing counters."""

    async def counters(self) -> list[ShardCounters]:
        """Per shard of every family: entries appended and entries the group has read."""
        ...


@runtime_checkable
class EventEncoder(Protocol):
    """Turns a routed event into the payload written to state, history and channel."""

    def encode(self, event: JobEvent) -> bytes:
        """The JSON payload of the event; deterministic; TypeError/ValueError if unencodable."""
        ...


@runtime_checkable
class Clock(Protocol):
    """Wall-clock and monotonic time, injectable for tests."""

    def now_ms(self) -> int:
        """Milliseconds since the epoch, comparable with stream entry ids."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for durations."""
        ...


@runtime_checkable
class HealthMetrics(Protocol):
    """What a process's health records: its supervised tasks and quarantined shards."""

    def shard_quarantined(self, domain: str, shard: int, quarantined: bool) -> None:
        """A permanent error took the shard out of routing (True) or it routes again."""
        ...

    def task_restarted(self, task: str) -> None:
        """A supervised task died with an unexpected error and was started again."""
        ...


class RouterMetrics(HealthMetrics, Protocol):
    """What the router reports about its work, aggregated per batch where possible."""

    def batch_routed(self, *, size: int, seconds: float) -> None:
        """One batch went through routing."""
        ...

    def events_judged(self, domain: str, verdict: Verdict, count: int) -> None:
        """`count` events of `domain` got `verdict`."""
        ...

    def events_published(self, domain: str, latencies_ms: Sequence[float]) -> None:
        """Events published, each with its entry-written → published latency."""
        ...

    def broadcast_failed(self, count: int) -> None:
        """A broadcast carrying `count` events failed."""
        ...

    def dead_lettered(self, domain: str, reason: RejectReason, count: int) -> None:
        """Entries sent to the dead-letter stream."""
        ...

    def trimmed_before_ack(self, domain: str, shard: int, count: int) -> None:
        """Entries deleted from the stream while still pending."""
        ...

    def reclaimed(self, domain: str, shard: int, count: int, seconds: float) -> None:
        """One shard's reclaim pass took over `count` entries."""
        ...

    def shard_observed(self, stats: ShardStats) -> None:
        """Fresh lag and pending figures for one shard."""
        ...

    def shard_held(self, domain: str, shard: int, since_ms: int | None) -> None:
        """This router holds the shard since `since_ms` (None: it does not hold it)."""
        ...

    def taken_over(self, domain: str, shard: int, *, claimed: int, seconds: float) -> None:
        """A shard was taken over: `claimed` entries left by its previous holder were routed
        in `seconds` from acquiring its lease."""
        ...

    def lease_lost(self, domain: str, shard: int) -> None:
        """Another router took a shard this one still believed it held."""
        ...

    def routers_alive(self, count: int) -> None:
        """Routers of the group alive at the last heartbeat."""
        ...


@runtime_checkable
class ProgressPublisher(Protocol):
    """Anything that publishes a job's stage event (the Redis or the in-memory producer)."""

    async def publish(self, event: StageEvent) -> str:
        """Append the event once; returns its stream entry id (the first one's, when the same
        (job, stage, status) was published already)."""
        ...

    async def publish_tokens(
        self,
        job_id: str,
        tokens: AsyncIterable[Any] | Iterable[Any],
        *,
        node: str | None = None,
        attempt: int = 0,
        coalesce_ms: float = DEFAULT_COALESCE_MS,
        first_seq: int = FIRST_TOKEN_SEQ,
    ) -> TokensPublished:
        """Append the text deltas (`str` or OpenAI-style chunks) as token entries in the order
        they come, merged within `coalesce_ms`, the n-th at seq `first_seq + n`; each entry is
        appended once per (job, attempt, seq), so a retry adds none."""
        ...


@runtime_checkable
class FrameWriter(Protocol):
    """Where a stream's frames go: its client's connection, in that connection's terms (a job's
    own stream, a stream of many jobs, UI message parts). Every frame of every stream goes
    through one: the replay and catch-ups from the stream's task once `writable` (else after
    `drained`), live events also straight from the feed's fan-out while the stream waits,
    with no task switch per viewer. Writes never block and keep their order."""

    def writable(self) -> bool:
        """Whether a frame written now goes out without piling up: the client is connected
        and its connection is not behind (its send buffer, or what is waiting, not full)."""
        ...

    async def drained(self) -> None:
        """Wait until `writable`, or until the client is gone (writes are then dropped)."""
        ...

    def write(self, frame: Frame) -> None:
        """One frame shared with other viewers (a live event): a writer may keep its bytes."""
        ...

    def write_all(self, frames: Sequence[Frame]) -> None:
        """Frames of this connection alone (a replay, a catch-up, a notice), in one write."""
        ...

    def keep_alive(self, every_s: float) -> None:
        """From now on, send a keepalive whenever nothing went to the connection for
        `every_s` (or a little longer: idleness is checked periodically)."""
        ...

    def stop_keepalive(self) -> None:
        """No more keepalives: the stream is over."""
        ...


@runtime_checkable
class FeedSubscription(Protocol):
    """One viewer's live events of one job, in publish order."""

    # An implementation may keep its instances dict-free: one is held per open stream.
    __slots__ = ()

    async def next(self, timeout_s: float) -> GatewayEvent | FeedGap | FeedClosed | None:
        """The next event, a gap notice, or None when `timeout_s` passes first; once the feed
        is closed and the events already received are taken, `FeedClosed`."""
        ...

    def next_nowait(self) -> GatewayEvent | None:
        """The next event if one is queued and no gap or close notice comes first; else None
        (`next` then tells what there is). A subscription may always answer None."""
        return None

    def write_through(self, handler: Callable[[LiveEvent], bool] | None) -> None:
        """While the viewer waits in `next` with nothing queued, offer each arriving event to
        `handler` first (synchronously, as it arrives); one it returns True for is handled
        and not queued. One `LiveEvent` goes to the handlers of every viewer of the job the
        feed delivers it to, and is settled once they all had it. None stops it. A
        subscription may ignore this and always queue."""
        return None

    async def close(self) -> None:
        """Stop receiving; the channel is unsubscribed when its last viewer closes."""
        ...


@runtime_checkable
class EventFeed(Protocol):
    """Live per-job events, many viewers sharing one Pub/Sub connection."""

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        """Subscribed once this returns: everything published afterwards is delivered."""
        ...

    def close_viewers(self) -> None:
        """Shutting down: every subscription, open or opened later, ends with `FeedClosed`."""
        ...


@runtime_checkable
class EventDecoder(Protocol):
    """Reads the seq and kind out of a routed payload."""

    def decode(self, payload: bytes) -> GatewayEvent | None:
        """The event, or None when the payload is not a routed event."""
        ...


@runtime_checkable
class Authorizer(Protocol):
    """Decides whether a request may read a job's events."""

    def authorize(self, token: str | None, job_id: str, *, domain: str) -> None:
        """Raise `Unauthorized` without a valid token, `Forbidden` if it does not name the job
        in `domain`."""
        ...

    def grant(self, token: str | None) -> Grant:
        """What the token opens, checked once (one decoding, whatever the jobs asked after):
        `Unauthorized` without a valid token (too long among them), `Forbidden` for a valid
        one that opens nothing."""
        ...


@runtime_checkable
class AdminAuthorizer(Protocol):
    """Decides whether a request may use the operator endpoints (the console)."""

    def authorize_admin(self, token: str | None) -> None:
        """Raise `Unauthorized` without a valid token, `Forbidden` if it is not an admin's."""
        ...


@runtime_checkable
class GatewayMetrics(Protocol):
    """What the SSE gateway reports."""

    def connection_opened(self) -> None:
        """A client connected."""
        ...

    def connection_closed(self, reason: str) -> None:
        """A client's stream ended: done, error, timeout, disconnect, shutdown."""
        ...

    def events_sent(self, count: int, *, replayed: bool) -> None:
        """Events written to a client, from the history (replayed) or live."""
        ...

    def snapshot_sent(self) -> None:
        """A snapshot told a client it may have missed events."""
        ...

    def events_dropped(self, count: int) -> None:
        """Events dropped for a slow client."""
        ...

    def event_overtaken(self) -> None:
        """A live event not sent: a newer seq of its job had been sent to the client first."""
        ...

    def delivered(self, latency_ms: float) -> None:
        """A live event reached a client this long after its entry was written."""
        ...

    def feed_failed(self) -> None:
        """The Pub/Sub reader lost its connection or failed: one per episode, not per retry."""
        ...

    def feed_recovered(self) -> None:
        """The Pub/Sub reader delivers again after an episode `feed_failed` began."""
        ...


class ReadinessMetrics(Protocol):
    """What a process reports each time its readiness is checked."""

    def readiness_checked(self, checks: Mapping[str, str]) -> None:
        """The checks just made, by name; a check passes when its value is "ok"."""
        ...


# A job as the gateways count its viewers: (domain, job id).
JobRef = tuple[str, str]


@runtime_checkable
class PresenceBoard(Protocol):
    """How many viewers each gateway has on each job, posted by the gateways themselves.

    Volatile by design: a gateway's counts vanish one TTL after its last post, so the counts
    of a gateway that died go away without anyone removing them.
    """

    async def post(self, gateway: str, changes: Mapping[JobRef, int], *, whole: bool) -> bool:
        """Renew the gateway's counts for one TTL and apply `changes` (0 removes a job), in one
        atomic step; with `whole`, `changes` replaces every count it had. Without `whole`,
        False (nothing applied) when its counts had lapsed or were never posted: post whole."""
        ...

    async def leave(self, gateway: str) -> None:
        """Remove the gateway's counts at once (a clean stop); idempotent."""
        ...

    async def viewers(self, domain: str, job_id: str) -> dict[str, int]:
        """The job's viewers per live gateway (gateways with none are left out)."""
        ...
