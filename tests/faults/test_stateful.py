"""Random interleavings of routers that share one consumer group through shard leases.

A hypothesis state machine runs several routers, each the real `RouterService` (`KeepLeases`,
and `ConsumeLoop` with `RouteBatch`, `ReclaimPending` and `ObserveShards`, over one
`HeldShards`), on the in-memory adapters: one `InMemoryStreams` whose `LeaseTable` keeps the
leases and fencing epochs, one state store, one broadcaster and the dead-letter stream, all on
one manual clock. The routers' loops are tasks of an event loop whose time is that clock
(`VirtualTimeLoop`): time passes only when a step lets it, from timer to timer, so leases are
renewed and lapse exactly as the timers say, with the production lease settings (TTL 4 s,
renewal every second), and a run repeats exactly.

Each router reaches every adapter through a `Gate`, the process it runs in. A call's request
and its reply each take a millisecond or two (the `Wire`; drawn per example), so the routers'
calls interleave and time passes while a router works. A gate can strike at a given call
(the next one, the n-th, or the next `apply`, `broadcast`, `ack`...): freeze the process there
(a paused process: what it has in flight goes on when it is thawed, with the fencing tokens
it had), kill it there (its tasks are cancelled; nothing more reaches a server: no release,
no ack), or lose that call's request or its reply (a broken connection; a lost reply means
the server did it).

Steps: a router joins (a new name, or the name of one that is gone: a restarted pod); a router
is stopped cleanly (its stop event: it drains, releases its shards and leaves); a router is
killed; a router is frozen and thawed later; a router is paused past its lease and resumed
(sometimes while another router is still taking its shards over, as new entries come);
a router's connection breaks; producers add events (new, retries of one already added, late
older seqs, malformed entries); a pending entry is deleted before its ack; the clock moves;
the Pub/Sub server, or the streams server (state, leases and dead letters too), goes down or
comes back. After every step the loop runs until every router waits (for an entry, a timer or
its gate).

The order a job's events are owed in is the stream's: an entry is owed a publish when its seq
is higher than every earlier entry of its job (a retry, or a late older seq, is not; a
router may still publish a late older seq it judges together with a newer one). Checked after
every step:
- each job's state takes its seqs in increasing order;
- every publish carries the entry that applied its seq: a retried entry never reaches a client;
- nothing applied is overtaken: once a seq is published, every lower seq applied before it has
  been published before it (so the gateway, which drops a seq at or below one it has sent,
  drops only repeats);
- the dead-letter stream holds malformed entries only, each at most once;
- a router ends only when stopped or killed, and a stopped router has released its shards
  (unless a call to the streams server failed meanwhile: its leases then lapse);
- a router that holds its shards does not spin: reads that bring nothing follow waits for
  entries that time out, batches or changes of shards, not waits that return at once.

Checked at the end, after healing (both servers up, frozen routers thawed, a router started if
none is left, the clock moved on until every shard is held and read and nothing is pending):
- every owed entry was applied by itself and published, and behind the gateway's filter a
  client gets each job's owed seqs in increasing order, ending at the job's state, which is
  the job's highest seq;
- nothing stranded: no entry pending or unread, and the dead-letter stream holds exactly the
  malformed entries, each once;
- an idle router makes a few calls a second (heartbeats, waits that time out, reclaim
  passes), not hundreds;
- once every router is stopped, no lease is left and no router counts as live.
An entry deleted before its ack is excused from being published or dead-lettered, as nothing
can be done with it.

`TestScriptedInterleavings` runs the interleavings that matter most every time, whatever
hypothesis draws.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import json
import random
import types
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast
from unittest import mock

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import eco_router.application.consume_loop as consume_loop_module
from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.adapters.memory.broadcaster import InMemoryBroadcaster
from eco_router.adapters.memory.dead_letters import InMemoryDeadLetterSink
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.leases import InMemoryLeaseStore
from eco_router.adapters.memory.metrics import InMemoryRouterMetrics
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup
from eco_router.application.backoff import Backoff
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.errors import BroadcastFailed, TransientError
from eco_router.application.held_shards import HeldShards, Phase
from eco_router.application.keep_leases import KeepLeases
from eco_router.application.observe_shards import ObserveShards
from eco_router.application.port_values import EncodedEvent, ReadBatch
from eco_router.application.ports import (
    Broadcaster,
    DeadLetterSink,
    EventSource,
    LeaseStore,
    StateStore,
)
from eco_router.application.reclaim_pending import ReclaimPending
from eco_router.application.route_batch import RouteBatch
from eco_router.application.router_service import RouterService
from tests.faults.virtual_time import VirtualClock, VirtualTimeLoop
from tests.unit.factories import CHANNEL_PREFIX, FAMILY, GROUP, START_MS, make_fields

T = TypeVar("T")

RESULTS_PATH = Path(__file__).parent / "results" / "stateful.json"
TITLE = "Routers sharing a consumer group through shard leases, random interleavings (hypothesis)"

# Two jobs share shard 0; shards 1 and 3 have one job each; shard 2 has none.
JOBS = ("job-a", "job-b", "job-c", "job-o")
MAX_SEQ = 8
MAX_LIVE_ROUTERS = 5  # 4 shards: the fifth is a standby
MAX_NAMES = 8
# The production settings: leases and timers cost nothing on the virtual clock.
LEASE_TTL_MS = 4_000
RENEW_MS = 1_000
READ_BLOCK_MS = 5_000
READ_COUNT = 2  # small, so batches and take-overs span several pages
RECLAIM_MIN_IDLE_MS = 30_000
RECLAIM_INTERVAL_S = 10.0
OBSERVE_INTERVAL_S = 5.0
DRAIN_GRACE_S = 6.0
# Above any delivery count a run can reach: poison handling has its own tests, and here an
# entry dead-lettered for its delivery count would hide a lost publish.
MAX_DELIVERIES = 10_000
# Far beyond what the clock moves in one run, so no state or marker expires mid-run.
TTL_S = 30 * 24 * 3600
# What a step takes besides the time it lets pass: every call under way is done by then.
SETTLE_MS = 100
HEAL_STEP_MS = RENEW_MS
# Once healed and with nothing to route, a router makes a few calls a second (heartbeats,
# waits for entries that time out, reclaim passes, statistics); a loop that spins makes
# hundreds.
IDLE_MS = 10_000
MAX_IDLE_CALLS = 100
MAX_EMPTY_READS = 20
HEAL_LIMIT_MS = 120_000
MAX_EXAMPLES = 1000
STEPS = 40

SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# A malformed entry of each kind the parser rejects, as a producer with a bug would write it.
MALFORMED: dict[str, dict[str, str | None]] = {
    "missing_job_id": {"job_id": None},
    "invalid_job_id": {"job_id": "job with spaces"},
    "missing_seq": {"seq": None},
    "seq_not_integer": {"seq": "seven"},
    "seq_negative": {"seq": "-3"},
    "progress_not_integer": {"progress": "lots"},
    "result_not_json": {"result": "{not json"},
}

# What a producer adds, weighted by repetition: mostly new events, some retries and late ones.
PRODUCED = ("new", "new", "new", "retry", "late", "malformed")
# Clock moves: within a renewal, about a lease, past a lease, past a reclaim idle time.
CLOCK_MOVES = st.sampled_from((10, 500, RENEW_MS, 2_500, LEASE_TTL_MS, 5_000, 12_000, 31_000))

# The calls of a router's adapters: a batch is a read (or a claim), an apply, a broadcast and
# dead letters, its acks going with the next read (or on their own before a claim and at
# stop); beside it run heartbeats, lease moves and the wake of a blocked read.
CALLS = (
    "read_new",
    "claim",
    "apply",
    "broadcast",
    "send",
    "ack",
    "interrupt",
    "heartbeat",
    "acquire",
    "release",
)
IN_FLIGHT = st.lists(st.sampled_from(PRODUCED), max_size=3)
# How long after its leases lapse a paused router resumes: another router takes its shards
# over right after they lapse, so a resume may land in the middle of that take-over.
RESUMED_AFTER_MS = st.integers(0, 60) | st.just(RENEW_MS)

EntryKey = tuple[str, str]  # (stream, entry id)


@dataclass(frozen=True)
class When:
    """The call a fault strikes: the first one named `call` (any call when None) once `after`
    more calls have gone through."""

    after: int = 0
    call: str | None = None

    @property
    def now(self) -> bool:
        return self.after == 0 and self.call is None


# Mid-batch when entries come meanwhile.
WHEN = st.builds(When, after=st.integers(0, 8), call=st.none() | st.sampled_from(CALLS))


class Fate(enum.Enum):
    """What an armed gate does at the call it strikes."""

    FREEZE = "freeze"
    DIE = "die"
    LOSE_REQUEST = "lose a request"  # that call fails before reaching the server
    LOSE_REPLY = "lose a reply"  # that call is done by the server, but fails for the router


@dataclass
class Server:
    """A server as the routers reach it: `up` False when they cannot (a partition), and the
    error a failed call raises in its adapter."""

    name: str
    failure: type[TransientError]
    up: bool = True


class Wire:
    """How long a request or a reply takes: always a millisecond, or, with a seed, 0, 1 or 2
    at random, so the routers' calls interleave differently. Time passes while a router
    works, as it does for a real one: a loop that keeps calling the servers cannot stop the
    clock (a heartbeat still comes due)."""

    def __init__(self, seed: int | None) -> None:
        self._random = None if seed is None else random.Random(seed)

    async def travel(self) -> None:
        ms = 1 if self._random is None else self._random.randint(0, 2)
        await asyncio.sleep(ms / 1000)


class Gate:
    """The process a router runs in, as its adapters see it: every call passes through here.

    A call's request and its reply each cross the `Wire`; a call to a server that is down
    fails. Armed with `arm(fate, when)`, the gate strikes at the call `when` names: it freezes
    (that call and every later one, replies included, wait until `thaw`), or dies (the call
    raises `CancelledError`, every later call too, and `on_death` cancels the router's
    tasks), or that call loses its request or its reply.
    """

    def __init__(self, wire: Wire, struck: Counter[Fate]) -> None:
        self.on_death: Callable[[], None] = lambda: None
        self.struck = struck
        self.frozen = False
        self.dead = False
        self.calls: Counter[str] = Counter()
        self.empty_reads = 0
        self.failed_calls = 0
        self._wire = wire
        self._open = asyncio.Event()
        self._open.set()
        self._armed: tuple[Fate, When] | None = None

    @property
    def armed(self) -> bool:
        return self._armed is not None and self._armed[0] in (Fate.FREEZE, Fate.DIE)

    def arm(self, fate: Fate, when: When = When()) -> None:
        self._armed = (fate, when)
        if when.now and fate in (Fate.FREEZE, Fate.DIE):
            self._strike()

    def thaw(self) -> None:
        """Resume a frozen process, and forget a fate not yet struck."""
        self._armed = None
        if self.frozen and not self.dead:
            self.frozen = False
            self._open.set()

    async def call(
        self, server: Server, name: str, method: Callable[[], Coroutine[Any, Any, T]]
    ) -> T:
        fate = self._count_down(name)
        self.calls[name] += 1
        await self._running()
        await self._wire.travel()
        if fate is Fate.LOSE_REQUEST or not server.up:
            self.failed_calls += 1
            raise server.failure(f"{server.name} did not answer")
        result = await method()
        await self._wire.travel()
        await self._running()
        if fate is None and self._armed == (Fate.LOSE_REPLY, When(call=name)):
            # Armed while this call was in flight (a read blocked on the server): the reply
            # on its way back is the one lost.
            fate = self._strike()
        if fate is Fate.LOSE_REPLY:
            self.failed_calls += 1
            raise server.failure(f"the reply from {server.name} was lost")
        if isinstance(result, ReadBatch) and not result.deliveries and not result.gaps:
            self.empty_reads += 1
        return result

    def _count_down(self, name: str) -> Fate | None:
        """The fate of this call, once the countdown has run out."""
        if self._armed is None:
            return None
        fate, when = self._armed
        if when.after > 0:
            self._armed = (fate, When(when.after - 1, when.call))
            return None
        if when.call not in (None, name):
            return None
        return self._strike()

    async def _running(self) -> None:
        await self._open.wait()
        if self.dead:
            raise asyncio.CancelledError

    def _strike(self) -> Fate | None:
        assert self._armed is not None
        fate, _ = self._armed
        self._armed = None
        self.struck[fate] += 1
        if fate is Fate.FREEZE:
            self.frozen = True
            self._open.clear()
        elif fate is Fate.DIE:
            self.dead = True
            self._open.set()  # calls waiting at a frozen gate die too
            self.on_death()
        else:
            return fate
        return None


class Gated:
    """A port seen from inside a gated process: each coroutine method goes through the gate."""

    def __init__(self, port: object, gate: Gate, server: Server) -> None:
        self._port = port
        self._gate = gate
        self._server = server

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._port, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        @functools.wraps(attribute)
        async def through_gate(*args: Any, **kwargs: Any) -> Any:
            call = functools.partial(attribute, *args, **kwargs)
            return await self._gate.call(self._server, name, call)

        return through_gate


class RecordingBroadcaster(InMemoryBroadcaster):
    """An in-memory broadcaster that counts the publishes it refused while down."""

    def __init__(self, *, channel_prefix: str) -> None:
        super().__init__(channel_prefix=channel_prefix)
        self.refused = 0

    async def broadcast(self, events: Sequence[EncodedEvent]) -> None:
        if not self.available:
            self.refused += len(events)
        await super().broadcast(events)


class Life(enum.Enum):
    """Where a router process is: running, draining after its stop, or ended."""

    RUNNING = "running"
    STOPPING = "stopping"
    GONE = "gone"


@dataclass
class Router:
    """One router process: its loops' task, its stop event, its gate and its held shards."""

    name: str
    gate: Gate
    held: HeldShards
    stop: asyncio.Event
    task: asyncio.Task[None]
    life: Life = Life.RUNNING
    tokens_at_stop: dict[str, int] = field(default_factory=dict)
    failed_calls_at_stop: int = 0

    @property
    def alive(self) -> bool:
        return self.life is not Life.GONE and not self.gate.dead


@dataclass(frozen=True)
class Produced:
    """One entry a producer wrote: a valid event of a job, in stream order."""

    job: str
    seq: int
    stream: str
    entry_id: str

    @property
    def key(self) -> EntryKey:
        return (self.stream, self.entry_id)


@dataclass(frozen=True)
class Published:
    """One payload the broadcaster sent."""

    job: str
    seq: int
    entry_id: str


@dataclass
class Totals:
    """Figures summed over the examples that ran, for the reliability report."""

    examples: int = 0
    sent: int = 0
    expected: int = 0
    published: int = 0
    lost: int = 0
    duplicated_to_clients: int = 0
    dead_lettered: int = 0
    routers_started: int = 0
    clean_stops: int = 0
    kills: int = 0
    freezes: int = 0
    pauses_past_lease: int = 0
    takeovers: int = 0
    entries_taken_over: int = 0
    leases_lost: int = 0
    refused_publishes: int = 0
    republishes: int = 0
    repeats_dropped_by_gateway: int = 0
    deleted_before_ack: int = 0
    streams_server_outages: int = 0
    lost_requests: int = 0
    lost_replies: int = 0
    late_seqs_published: int = 0


class LeasedRoutersMachine(RuleBasedStateMachine):
    """Routers joining, stopping, dying, pausing and cut off, producers, server outages."""

    def __init__(self, totals: Totals) -> None:
        super().__init__()
        self.totals = totals
        self.clock = VirtualClock(START_MS)
        self.loop = VirtualTimeLoop(self.clock)
        # ConsumeLoop measures its drain grace on time.monotonic(): here time is the clock's.
        self._time_patch = mock.patch.object(
            consume_loop_module, "time", types.SimpleNamespace(monotonic=self.clock.monotonic)
        )
        self._time_patch.start()
        self.streams = InMemoryStreams(self.clock)
        self.table = self.streams.lease_table(GROUP)
        self.store = InMemoryStateStore(
            clock=self.clock,
            streams=self.streams,
            group=GROUP,
            state_ttl_s=TTL_S,
            markers_ttl_s=TTL_S,
            history_size=1_000,
        )
        self.broadcaster = RecordingBroadcaster(channel_prefix=CHANNEL_PREFIX)
        # Streams, state, leases and dead letters live on one server; Pub/Sub is the
        # broadcaster's own (`available`), and a lost reply from it is a failed publish.
        self.streams_server = Server("the streams server", TransientError)
        self.pubsub_server = Server("the Pub/Sub server", BroadcastFailed)
        self.dead_letters = InMemoryDeadLetterSink(self.streams)
        self.encoder = OrjsonEventEncoder()
        self.metrics = InMemoryRouterMetrics()
        self.routers: dict[str, Router] = {}
        self.produced: dict[str, list[Produced]] = defaultdict(list)
        self.malformed: set[EntryKey] = set()
        self.deleted: set[EntryKey] = set()
        self.counts: Counter[str] = Counter()
        self.struck: Counter[Fate] = Counter()
        self.wire = Wire(None)
        # Reads that block on the server (one server, Sentinel), or waits with XREAD (Cluster).
        self.blocking_reads = True

    # --- rules: routers ---

    @initialize(
        count=st.integers(1, 3),
        wire_seed=st.none() | st.integers(0, 2**16),
        blocking_reads=st.booleans(),
    )
    def start_routers(self, count: int, wire_seed: int | None, blocking_reads: bool) -> None:
        self.wire = Wire(wire_seed)
        self.blocking_reads = blocking_reads
        for _ in range(count):
            self.start_router(self.fresh_name())
        self.settle()

    @precondition(
        lambda self: (
            sum(r.alive for r in self.routers.values()) < MAX_LIVE_ROUTERS
            and (len(self.routers) < MAX_NAMES or self.gone_names())
        )
    )
    @rule(data=st.data(), restart=st.booleans())
    def add_router(self, data: st.DataObject, restart: bool) -> None:
        """A router joins: a new one, or one that is gone restarting under its old name."""
        gone = self.gone_names()
        if (restart and gone) or len(self.routers) >= MAX_NAMES:
            name = data.draw(st.sampled_from(gone), label="restarted router")
        else:
            name = self.fresh_name()
        self.start_router(name)
        self.settle()

    @precondition(lambda self: self.running_names())
    @rule(data=st.data())
    def stop_router(self, data: st.DataObject) -> None:
        """A clean stop (SIGTERM): the router drains, releases its shards and leaves."""
        self.stop(data.draw(st.sampled_from(self.running_names()), label="stopped router"))
        self.settle()

    @precondition(lambda self: self.alive_names())
    @rule(data=st.data(), when=WHEN, kinds=IN_FLIGHT)
    def kill_router(self, data: st.DataObject, when: When, kinds: list[str]) -> None:
        """SIGKILL, now or at a later call: mid-batch when entries of its shards come."""
        name = data.draw(st.sampled_from(self.alive_names()), label="killed router")
        # A frozen process makes no calls: it dies where it stands.
        self.arm(name, Fate.DIE, When() if self.routers[name].gate.frozen else when)
        self.produce_for(name, data, kinds)
        self.settle()

    @precondition(lambda self: self.alive_names(thawed=True))
    @rule(data=st.data(), when=WHEN, kinds=IN_FLIGHT)
    def freeze_router(self, data: st.DataObject, when: When, kinds: list[str]) -> None:
        """The process stops running (SIGSTOP, a long GC pause), now or at a later call."""
        name = data.draw(st.sampled_from(self.alive_names(thawed=True)), label="frozen router")
        self.arm(name, Fate.FREEZE, when)
        self.produce_for(name, data, kinds)
        self.settle()

    @precondition(lambda self: self.frozen_names())
    @rule(data=st.data())
    def thaw_router(self, data: st.DataObject) -> None:
        """A frozen process runs again, from where it stood, with the tokens it had."""
        self.thaw(data.draw(st.sampled_from(self.frozen_names()), label="thawed router"))
        self.settle()

    @precondition(lambda self: self.alive_names(thawed=True))
    @rule(data=st.data(), when=WHEN, kinds=IN_FLIGHT, after_ms=RESUMED_AFTER_MS, later=IN_FLIGHT)
    def pause_past_lease(
        self, data: st.DataObject, when: When, kinds: list[str], after_ms: int, later: list[str]
    ) -> None:
        """A process pauses, mid-batch when entries of its shards come, for its lease or
        longer, then resumes with the tokens it had, maybe while another router is still
        taking its shards over and more entries come."""
        name = data.draw(st.sampled_from(self.alive_names(thawed=True)), label="paused router")
        self.counts["pauses_past_lease"] += 1
        gate = self.routers[name].gate
        gate.arm(Fate.FREEZE, when)
        self.produce_for(name, data, kinds)
        self.settle()
        if not gate.frozen:
            gate.arm(Fate.FREEZE)  # it made no such call: it pauses where it waits
        expiries = [lease.expires_ms for lease in self.table.leases.values() if lease.owner == name]
        lapsed_ms = max(expiries, default=self.clock.now_ms() + LEASE_TTL_MS) - self.clock.now_ms()
        self.loop.run_until_idle(max(0, lapsed_ms) + after_ms)
        self.produce_for(name, data, later)
        gate.thaw()
        self.settle()

    # --- rules: producers, servers and time ---

    @rule(data=st.data(), kinds=st.lists(st.sampled_from(PRODUCED), min_size=1, max_size=4))
    def produce(self, data: st.DataObject, kinds: list[str]) -> None:
        """Producers add a few entries back to back: new, retried, late or malformed."""
        for kind in kinds:
            self.produce_one(data, kind)
        self.settle()

    @precondition(lambda self: self.pending_keys())
    @rule(data=st.data())
    def delete_pending_entry(self, data: st.DataObject) -> None:
        """The stream is trimmed past an entry that is pending: it is gone before its ack."""
        stream, entry_id = data.draw(st.sampled_from(self.pending_keys()), label="deleted")
        self.streams.delete_entry(stream, entry_id)
        self.deleted.add((stream, entry_id))
        self.settle()

    @rule(ms=CLOCK_MOVES)
    def advance_clock(self, ms: int) -> None:
        self.settle(ms)

    @rule()
    def toggle_pubsub(self) -> None:
        self.broadcaster.available = not self.broadcaster.available
        self.settle()

    @rule()
    def toggle_streams_server(self) -> None:
        """The routers lose the streams server (leases lapse on it meanwhile), or get it back."""
        self.streams_server.up = not self.streams_server.up
        self.counts["streams_server_outages"] += not self.streams_server.up
        self.settle()

    @precondition(lambda self: self.alive_names(thawed=True))
    @rule(data=st.data(), when=WHEN, reply=st.booleans(), kinds=IN_FLIGHT)
    def break_connection(
        self, data: st.DataObject, when: When, reply: bool, kinds: list[str]
    ) -> None:
        """A router's connection breaks: one of its next calls loses its request, or is done
        by the server and loses its reply."""
        name = data.draw(st.sampled_from(self.alive_names(thawed=True)), label="cut router")
        fate = Fate.LOSE_REPLY if reply else Fate.LOSE_REQUEST
        self.arm(name, fate, when)
        self.produce_for(name, data, kinds)
        self.settle()

    # --- invariants after every step ---

    @invariant()
    def each_job_is_applied_in_seq_order(self) -> None:
        for job in JOBS:
            seqs = [seq for seq, _ in self.history(job)]
            assert seqs == sorted(set(seqs)), f"{job} applied out of order: {seqs}"

    @invariant()
    def only_the_entry_that_applied_a_seq_is_published(self) -> None:
        applied = {job: dict(self.history(job)) for job in JOBS}
        for item in self.sent():
            assert applied[item.job].get(item.seq) == item.entry_id, (
                f"{item} published, but {item.job} seq {item.seq} was applied by "
                f"{applied[item.job].get(item.seq)}"
            )

    @invariant()
    def no_applied_seq_is_overtaken(self) -> None:
        for job in JOBS:
            kept = {item.seq: item.entry_id for item in self.behind_gateway(job)}
            top = max(kept, default=0)
            for seq, entry_id in self.history(job):
                if seq < top and (FAMILY.stream_for(job), entry_id) not in self.deleted:
                    assert kept.get(seq) == entry_id, (
                        f"{job} seq {seq} (entry {entry_id}) was applied but seq {top} was "
                        f"published first: a client never gets it; published "
                        f"{[(i.seq, i.entry_id) for i in self.sent() if i.job == job]}"
                    )

    @invariant()
    def the_dead_letter_stream_holds_malformed_entries_once(self) -> None:
        letters = self.dead_letter_keys()
        assert set(letters) <= self.malformed, set(letters) - self.malformed
        twice = {key: n for key, n in letters.items() if n > 1}
        assert not twice, f"dead-lettered more than once: {twice}"

    # --- the end: heal, then nothing lost, out of order, duplicated or stranded ---

    def teardown(self) -> None:
        try:
            self.heal()
            self.check_idle()
            self.stop_everyone()
            self.check_outcome()
        finally:
            self.close()

    def heal(self) -> None:
        self.broadcaster.available = True
        self.streams_server.up = True
        for router in self.routers.values():
            if not router.gate.dead:
                router.gate.thaw()
        if not self.running_names():
            self.start_router(self.gone_names()[0] if self.gone_names() else self.fresh_name())
        self.settle()
        waited = 0
        while not self.healed():
            assert waited < HEAL_LIMIT_MS, (
                f"not healed after {waited} ms: pending {self.pending_keys()}, unread "
                f"{self.unread()}, held {self.held_by()}, leases {self.table.leases}"
            )
            self.settle(HEAL_STEP_MS)
            waited += HEAL_STEP_MS

    def healed(self) -> bool:
        """Nothing pending or unread, no stop under way, every shard read by its holder, and
        no router still believing it holds a shard that another one took."""
        if self.pending_keys() or self.unread():
            return False
        if any(r.life is Life.STOPPING for r in self.routers.values()):
            return False
        held = [
            (stream, token)
            for router in self.routers.values()
            if router.alive
            for stream, token in router.held.tokens().items()
        ]
        reading = {
            stream: token
            for router in self.routers.values()
            if router.alive
            for stream, token in router.held.tokens([Phase.READING]).items()
        }
        return all(self.table.holds(s, t) for s, t in held) and all(
            self.table.holds(s, reading.get(s, -1)) for s in FAMILY.streams
        )

    def check_idle(self) -> None:
        """With nothing to route, no router keeps calling the servers."""
        before = {name: r.gate.calls.copy() for name, r in self.routers.items() if r.alive}
        self.settle(IDLE_MS)
        busy = {
            name: dict(calls)
            for name, r in self.routers.items()
            if r.alive
            and (calls := r.gate.calls - before.get(name, Counter())).total() > MAX_IDLE_CALLS
        }
        assert not busy, f"calls in {IDLE_MS} ms with nothing to route: {busy}"

    def stop_everyone(self) -> None:
        for name in self.running_names():
            self.stop(name)
        self.settle(RENEW_MS)
        # What killed routers left lapses; then no router counts as live.
        self.settle(LEASE_TTL_MS)
        assert all(r.life is Life.GONE for r in self.routers.values()), self.lives()
        live_leases = {s: lease for s in FAMILY.streams if (lease := self.table.live_lease(s))}
        assert live_leases == {}, f"leases left after every router stopped: {live_leases}"
        assert self.table.live_routers() == {}, self.table.live_routers()

    def check_outcome(self) -> None:
        problems: list[str] = []
        owed_total = published_total = lost = duplicated = repeats = late = 0
        sent = self.sent()
        for job in JOBS:
            applied = dict(self.history(job))
            published = [item for item in sent if item.job == job]
            kept = self.behind_gateway(job)
            kept_seqs = {item.seq: item.entry_id for item in kept}
            owed = [e for e in self.owed(job) if e.key not in self.deleted]
            owed_total += len(owed)
            for entry in owed:
                if applied.get(entry.seq) != entry.entry_id:
                    problems.append(
                        f"{job}: {entry} owed, but seq {entry.seq} applied by "
                        f"{applied.get(entry.seq)}"
                    )
                if kept_seqs.get(entry.seq) == entry.entry_id:
                    published_total += 1
                else:
                    lost += 1
                    problems.append(
                        f"{job}: {entry} owed, never reached a client: published "
                        f"{[(i.seq, i.entry_id) for i in published]}"
                    )
            duplicated += sum(1 for item in published if applied.get(item.seq) != item.entry_id)
            repeats += len(published) - len(kept)
            late += len(set(kept_seqs) - {e.seq for e in owed})
            problems += self.state_problems(job, applied, kept)
        letters = self.dead_letter_keys()

        t = self.totals
        t.examples += 1
        t.sent += sum(len(v) for v in self.produced.values()) + len(self.malformed)
        t.expected += owed_total
        t.published += published_total
        t.lost += lost
        t.duplicated_to_clients += duplicated
        t.dead_lettered += sum(letters.values())
        t.routers_started += len(self.routers) + self.counts["restarts"]
        t.clean_stops += self.counts["clean_stops"]
        t.kills += self.struck[Fate.DIE]
        t.freezes += self.struck[Fate.FREEZE]
        t.pauses_past_lease += self.counts["pauses_past_lease"]
        t.streams_server_outages += self.counts["streams_server_outages"]
        t.lost_requests += self.struck[Fate.LOSE_REQUEST]
        t.lost_replies += self.struck[Fate.LOSE_REPLY]
        t.takeovers += sum(1 for _, _, claimed in self.metrics.takeovers if claimed)
        t.entries_taken_over += sum(claimed for _, _, claimed in self.metrics.takeovers)
        t.leases_lost += sum(self.metrics.leases_lost.values())
        t.refused_publishes += self.broadcaster.refused
        t.republishes += len(sent) - len({(i.job, i.seq) for i in sent})
        t.repeats_dropped_by_gateway += repeats
        t.deleted_before_ack += len(self.deleted)
        t.late_seqs_published += late

        assert problems == [], "\n".join(problems)
        assert duplicated == 0, f"{duplicated} duplicates would have reached clients"
        assert self.pending_keys() == [], f"stranded: {self.pending_keys()}"
        assert self.unread() == 0
        expected_letters = self.malformed - self.deleted
        assert set(letters) - self.deleted == expected_letters, (
            f"dead-lettered {sorted(letters)}, malformed {sorted(self.malformed)}"
        )
        assert max(letters.values(), default=1) == 1, letters

    def state_problems(self, job: str, applied: dict[int, str], kept: list[Published]) -> list[str]:
        """The state ends at the job's highest seq (one of a deleted entry's, at most, when
        a higher one was deleted unrouted), and a client's last event is the state's."""
        valid = self.produced[job]
        highest = max((e.seq for e in valid), default=None)
        standing = max((e.seq for e in valid if e.key not in self.deleted), default=None)
        state = self.state_seq(job)
        if state is None:
            return [] if standing is None else [f"{job}: no state, highest seq {standing}"]
        if highest is None or not (standing or 0) <= state <= highest:
            return [f"{job}: state at {state}, highest seq {highest}"]
        got = [item.seq for item in kept]
        deleted = (FAMILY.stream_for(job), applied[state]) in self.deleted
        if got[-1:] != [state] and not deleted:
            return [f"{job}: a client got {got}, the state is {state}"]
        return []

    def close(self) -> None:
        try:
            # Every process dies (a frozen one would hold its cleanup), then every task ends.
            for router in self.routers.values():
                if not router.gate.dead:
                    router.gate.arm(Fate.DIE)
            self.loop.cancel_all()
        finally:
            self._time_patch.stop()
            self.loop.close()

    # --- acting on routers ---

    def fresh_name(self) -> str:
        return f"router-{len(self.routers)}"

    def start_router(self, name: str) -> None:
        if name in self.routers:
            self.counts["restarts"] += 1
        gate = Gate(self.wire, self.struck)
        held = HeldShards()
        source = cast(
            EventSource,
            Gated(
                InMemoryEventSource(
                    self.streams,
                    families=[FAMILY],
                    group=GROUP,
                    consumer=name,
                    blocking=self.blocking_reads,
                ),
                gate,
                self.streams_server,
            ),
        )
        broadcaster = cast(Broadcaster, Gated(self.broadcaster, gate, self.pubsub_server))
        route = RouteBatch(
            source=source,
            store=cast(StateStore, Gated(self.store, gate, self.streams_server)),
            broadcaster=broadcaster,
            dead_letters=cast(DeadLetterSink, Gated(self.dead_letters, gate, self.streams_server)),
            encoder=self.encoder,
            metrics=self.metrics,
            clock=self.clock,
            max_deliveries=MAX_DELIVERIES,
        )
        service = RouterService(
            leases=KeepLeases(
                leases=cast(
                    LeaseStore,
                    Gated(
                        InMemoryLeaseStore(self.table, ttl_ms=LEASE_TTL_MS),
                        gate,
                        self.streams_server,
                    ),
                ),
                held=held,
                router=name,
                families=[FAMILY],
                metrics=self.metrics,
                clock=self.clock,
                renew_s=RENEW_MS / 1000,
            ),
            consume=ConsumeLoop(
                source=source,
                route=route,
                held=held,
                metrics=self.metrics,
                clock=self.clock,
                read_count=READ_COUNT,
                block_ms=READ_BLOCK_MS,
                backoff=Backoff(initial_s=0.05, max_s=1.0, jitter=0.0),
                drain_grace_s=DRAIN_GRACE_S,
            ),
            reclaim=ReclaimPending(
                source=source,
                broadcaster=broadcaster,
                route=route,
                held=held,
                metrics=self.metrics,
                clock=self.clock,
                min_idle_ms=RECLAIM_MIN_IDLE_MS,
                page_size=READ_COUNT,
            ),
            observe=ObserveShards(source=source, metrics=self.metrics),
            reclaim_interval_s=RECLAIM_INTERVAL_S,
            observe_interval_s=OBSERVE_INTERVAL_S,
        )
        stop = asyncio.Event()
        task = self.loop.create_task(service.run(stop), name=name)
        router = Router(name, gate, held, stop, task)
        gate.on_death = task.cancel
        self.routers[name] = router

    def stop(self, name: str) -> None:
        router = self.routers[name]
        router.life = Life.STOPPING
        router.tokens_at_stop = router.held.tokens()
        router.failed_calls_at_stop = router.gate.failed_calls
        router.stop.set()

    def arm(self, name: str, fate: Fate, when: When = When()) -> None:
        self.routers[name].gate.arm(fate, when)

    def thaw(self, name: str) -> None:
        self.routers[name].gate.thaw()

    def settle(self, ms: int = 0) -> None:
        """Let `ms` pass on the clock, and the little more that calls in flight take, until
        every router waits (for an entry, a timer or its gate); meanwhile, no router that
        holds its shards reads them over and over for nothing."""
        holders = {n for n, r in self.routers.items() if self.holds_its_shards(r)}
        empty = {n: self.routers[n].gate.empty_reads for n in holders}
        self.loop.run_until_idle(ms + SETTLE_MS)
        # An empty read follows a wait for entries that timed out, or a batch, or a change
        # of shards; one that follows a wait which returned at once is a spin.
        allowed = MAX_EMPTY_READS + 2 * (ms + SETTLE_MS) // READ_BLOCK_MS
        spinning = {
            n: reads
            for n in holders
            if self.holds_its_shards(self.routers[n])
            and (reads := self.routers[n].gate.empty_reads - empty[n]) > allowed
        }
        assert not spinning, f"empty reads in {ms + SETTLE_MS} ms: {spinning}"
        for router in self.routers.values():
            if router.life is Life.GONE or not router.task.done():
                continue
            if router.gate.dead:
                router.life = Life.GONE
                continue
            error = None if router.task.cancelled() else router.task.exception()
            assert error is None, f"{router.name} failed: {error!r}"
            assert router.life is Life.STOPPING, f"{router.name} ended without being stopped"
            self.check_released(router)
            router.life = Life.GONE
            self.counts["clean_stops"] += 1

    def holds_its_shards(self, router: Router) -> bool:
        """Running, and every shard it holds is still its own (no other router took one)."""
        return (
            router.alive
            and not router.gate.frozen
            and all(self.table.holds(s, t) for s, t in router.held.tokens().items())
        )

    def check_released(self, router: Router) -> None:
        """A stopped router handed back every lease it held and left the live set, unless a
        call failed meanwhile (then its leases lapse by themselves)."""
        if router.gate.failed_calls > router.failed_calls_at_stop:
            return
        assert router.held.streams() == [], f"{router.name} still holds {router.held.streams()}"
        for stream, token in router.tokens_at_stop.items():
            lease = self.table.live_lease(stream)
            assert lease is None or lease.token != token, (
                f"{router.name} stopped but its lease on {stream} lives on: {lease}"
            )
        assert router.name not in self.table.live_routers(), f"{router.name} still counts as live"

    # --- producing ---

    def produce_for(self, name: str, data: st.DataObject, kinds: list[str]) -> None:
        """Entries of the jobs on the shards `name` holds (any job when it holds none)."""
        held = self.routers[name].held.streams()
        jobs = tuple(j for j in JOBS if FAMILY.stream_for(j) in held) or JOBS
        for kind in kinds:
            self.produce_one(data, kind, jobs)

    def produce_one(self, data: st.DataObject, kind: str, jobs: tuple[str, ...] = JOBS) -> None:
        job = data.draw(st.sampled_from(jobs), label="job")
        seqs = sorted({e.seq for e in self.produced[job]})
        highest = max(seqs, default=0)
        if kind == "retry" and seqs:
            # A producer that timed out adds the same event again: another entry, same seq.
            self.add_valid(job, data.draw(st.sampled_from(seqs), label="retried seq"))
        elif kind == "late" and highest > 1:
            self.add_valid(job, data.draw(st.integers(1, highest - 1), label="late seq"))
        elif kind == "malformed":
            self.add_malformed(job, data.draw(st.sampled_from(sorted(MALFORMED)), label="problem"))
        else:
            self.add_valid(job, data.draw(st.integers(1, MAX_SEQ), label="seq"))

    def add_valid(self, job: str, seq: int) -> str:
        # The same fields for the same (job, seq): a retry is byte for byte the first entry.
        stream = FAMILY.stream_for(job)
        fields = make_fields(job_id=job, seq=seq, stage=f"step-{seq}", progress=min(99, 10 * seq))
        entry_id = self.streams.xadd(stream, fields)
        self.produced[job].append(Produced(job, seq, stream, entry_id))
        return entry_id

    def add_malformed(self, job: str, problem: str) -> str:
        stream = FAMILY.stream_for(job)
        entry_id = self.streams.xadd(stream, make_fields(**{"job_id": job, **MALFORMED[problem]}))
        self.malformed.add((stream, entry_id))
        return entry_id

    # --- what happened ---

    def owed(self, job: str) -> list[Produced]:
        """The job's entries whose seq is higher than every earlier entry's, in stream order."""
        owed, top = [], 0
        for entry in self.produced[job]:
            if entry.seq > top:
                owed.append(entry)
                top = entry.seq
        return owed

    def sent(self) -> list[Published]:
        found = []
        for _, payload in self.broadcaster.sent:
            message = orjson.loads(payload)
            found.append(Published(message["job_id"], message["seq"], message["stream_id"]))
        return found

    def behind_gateway(self, job: str) -> list[Published]:
        """What a client gets: the gateway drops a seq at or below one it has sent."""
        kept: list[Published] = []
        for item in self.sent():
            if item.job == job and (not kept or item.seq > kept[-1].seq):
                kept.append(item)
        return kept

    def history(self, job: str) -> list[tuple[int, str]]:
        view = result_of(self.store.view(FAMILY.domain, job))
        return [
            (message["seq"], message["stream_id"]) for message in map(orjson.loads, view.history)
        ]

    def state_seq(self, job: str) -> int | None:
        view = result_of(self.store.view(FAMILY.domain, job))
        return None if view.state is None else int(orjson.loads(view.state)["seq"])

    def dead_letter_keys(self) -> Counter[EntryKey]:
        return Counter(
            (fields[b"stream"].decode(), fields[b"id"].decode())
            for _, fields in self.streams.entries(FAMILY.dead_letter_stream)
        )

    def pending_keys(self) -> list[EntryKey]:
        found = []
        for stream in FAMILY.streams:
            try:
                found += [(stream, i) for i in self.streams.pending(stream, GROUP)]
            except NoGroup:  # the first router to start creates the group
                continue
        return sorted(found)

    def unread(self) -> int:
        total = 0
        for stream in FAMILY.streams:
            try:
                total += self.streams.lag(stream, GROUP)
            except NoGroup:
                total += len(self.streams.entries(stream))
        return total

    def holder_of(self, job: str) -> str:
        stream = FAMILY.stream_for(job)
        [name] = [n for n, r in self.routers.items() if r.alive and stream in r.held.streams()]
        return name

    def held_by(self) -> dict[str, dict[str, tuple[int, str]]]:
        return {
            r.name: {s: (h.token, h.phase.value) for s in r.held.streams() if (h := r.held.get(s))}
            for r in self.routers.values()
            if r.alive
        }

    def lives(self) -> dict[str, str]:
        return {
            r.name: r.life.value + (" (dead)" if r.gate.dead else "") for r in self.routers.values()
        }

    def running_names(self) -> list[str]:
        return [n for n, r in self.routers.items() if r.life is Life.RUNNING and not r.gate.dead]

    def alive_names(self, *, thawed: bool = False) -> list[str]:
        return [
            n
            for n, r in self.routers.items()
            if r.alive and not (thawed and (r.gate.frozen or r.gate.armed))
        ]

    def frozen_names(self) -> list[str]:
        return [n for n, r in self.routers.items() if r.alive and (r.gate.frozen or r.gate.armed)]

    def gone_names(self) -> list[str]:
        return [n for n, r in self.routers.items() if r.life is Life.GONE]


class TestScriptedInterleavings:
    """The interleavings that matter most, always run, whatever hypothesis draws; each ends
    with the machine's own end checks (heal, stop everyone, then the outcome)."""

    def test_a_router_paused_between_apply_and_publish_past_its_lease_reorders_nothing(
        self,
    ) -> None:
        with scripted_machine(routers=2) as m:
            paused = m.holder_of("job-a")
            m.arm(paused, Fate.FREEZE, When(call="broadcast"))
            m.add_valid("job-a", 1)
            m.settle()
            assert m.routers[paused].gate.frozen
            assert m.history("job-a") != []
            assert m.sent() == []

            m.settle(LEASE_TTL_MS + RENEW_MS)  # the other router takes the shard over
            m.add_valid("job-a", 2)
            m.settle()
            m.thaw(paused)  # its publish of seq 1 goes out now, after seq 2
            m.settle()

            assert [i.seq for i in m.sent() if i.job == "job-a"] == [1, 2, 1]
            assert [i.seq for i in m.behind_gateway("job-a")] == [1, 2]

    def test_a_router_killed_between_its_dead_letter_and_its_ack_leaves_one_letter(
        self,
    ) -> None:
        with scripted_machine(routers=2) as m:
            killed = m.holder_of("job-a")
            # Acks ride on the next read: it dies as it sends the one that carries this ack.
            m.arm(killed, Fate.DIE, When(call="read_new"))
            m.add_malformed("job-a", "seq_not_integer")
            m.settle()
            assert m.routers[killed].gate.dead
            assert sum(m.dead_letter_keys().values()) == 1
            assert len(m.pending_keys()) == 1

            m.settle(LEASE_TTL_MS + RENEW_MS)  # the other router takes the entry over

            assert m.pending_keys() == []
            assert sum(m.dead_letter_keys().values()) == 1

    def test_entries_read_with_a_lost_reply_are_routed_before_newer_ones(self) -> None:
        with scripted_machine(routers=1) as m:
            m.arm("router-0", Fate.LOSE_REPLY, When(call="read_new"))
            m.add_valid("job-a", 1)
            m.loop.run_until_idle(10)  # the read is done, its reply lost; a retry is due
            assert len(m.pending_keys()) == 1
            assert m.sent() == []

            m.add_valid("job-a", 2)
            m.settle()

            assert [i.seq for i in m.sent()] == [1, 2]

    def test_routing_goes_on_after_a_streams_server_outage_longer_than_the_leases(
        self,
    ) -> None:
        with scripted_machine(routers=2) as m:
            m.add_valid("job-a", 1)
            m.settle()
            m.streams_server.up = False
            m.add_valid("job-a", 2)
            m.settle(3 * LEASE_TTL_MS)  # every lease lapses on the server meanwhile
            m.streams_server.up = True
            m.add_valid("job-a", 3)
            m.settle(RENEW_MS)

            assert [i.seq for i in m.sent()] == [1, 2, 3]
            assert all(m.table.live_lease(s) for s in FAMILY.streams)

    def test_a_stopped_router_hands_its_shards_over_at_once(self) -> None:
        with scripted_machine(routers=2) as m:
            m.stop("router-0")
            m.settle()
            assert m.routers["router-0"].life is Life.GONE

            m.settle(RENEW_MS)  # the other router's next heartbeat takes them

            assert set(m.routers["router-1"].held.streams()) == set(FAMILY.streams)


@contextmanager
def scripted_machine(*, routers: int) -> Iterator[LeasedRoutersMachine]:
    """A machine outside hypothesis with `routers` routers (calls take one loop turn each
    way), checked at the end as hypothesis checks it, closed whatever happens."""
    machine = LeasedRoutersMachine(Totals())
    try:
        machine.start_routers(count=routers, wire_seed=None, blocking_reads=True)
        yield machine
    except BaseException:
        machine.close()
        raise
    machine.teardown()


def result_of(coroutine: Coroutine[Any, Any, T]) -> T:
    """The value of a coroutine that never waits (an in-memory query), without the loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise AssertionError("an in-memory query waited")


class TestLeasedRouters:
    def test_every_owed_event_reaches_clients_in_order_whatever_the_interleaving(self) -> None:
        totals = Totals()
        passed = False
        try:
            # Any factory of machines will do (hypothesis's docstring); the stub wants a class.
            run_state_machine_as_test(
                lambda: LeasedRoutersMachine(totals),  # type: ignore[arg-type]
                settings=SETTINGS,
            )
            passed = totals.examples > 1
        finally:
            write_result(totals, passed=passed)
        assert totals.examples > 1


def write_result(totals: Totals, *, passed: bool) -> None:
    """tests/faults/results/stateful.json, in the format every fault scenario writes."""
    observed = asdict(totals)
    counts = ("sent", "expected", "published", "lost", "duplicated_to_clients", "dead_lettered")
    result = {
        "scenario": "stateful",
        "title": TITLE,
        "params": {
            "examples": totals.examples,
            "max_examples": MAX_EXAMPLES,
            "steps_per_example": STEPS,
            "jobs": len(JOBS),
            "shards": FAMILY.shards,
            "seqs": f"1-{MAX_SEQ}",
            "live_routers": f"1 to 3 at start, up to {MAX_LIVE_ROUTERS}",
            "lease_ttl_ms": LEASE_TTL_MS,
            "lease_renew_ms": RENEW_MS,
            "malformed_kinds": sorted(MALFORMED),
            **{k: v for k, v in observed.items() if k not in (*counts, "examples")},
        },
        **{k: observed[k] for k in counts},
        "recovery_s": 0.0,
        "passed": passed,
    }
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(result, indent=2) + "\n")
