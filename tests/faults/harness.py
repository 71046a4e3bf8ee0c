"""The rig of the fault scenarios: router processes, a producer, SSE viewers, the checks, figures.

Every check looks from the outside, as an operator would: what the streams hold (XRANGE, and
what the producer wrote), what reached Pub/Sub and each SSE client through the gateway, what the
state keys hold, what is pending in the group and what the dead-letter stream holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import itertools
import json
import os
import random
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from eco_router.adapters.dead_letter_format import read_dead_letter
from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.adapters.progress_entries import PreparedEntry
from eco_router.adapters.redis.connections.connection import RedisClient, redis_client
from eco_router.adapters.redis.connections.replica_wait import ReplicasBehind, ReplicaWait
from eco_router.adapters.redis.connections.topology import Standalone, parse_redis_url
from eco_router.adapters.redis.errors import CLOSED_ERRORS, closed_under_command
from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.adapters.redis.producer.publisher import script_arguments
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.event import JobEvent
from eco_router.domain.event_size import DEFAULT_SIZE_LIMITS
from eco_router.domain.parsing import parse_entry
from eco_router.domain.progress import StageEvent
from eco_router.domain.rejection import RejectReason
from eco_router.domain.streams import StreamFamily, hash_tag
from eco_router.producer import laid_out, producer_config
from tests.faults.observers import Collector
from tests.integration.sse_client import SseStream, open_sse
from tests.integration.support import (
    GROUP,
    SCAN,
    PubSubCollector,
    WorkerProcess,
    pending_by_consumer,
    pending_count,
)
from tests.integration.test_gateway import Gateway, free_port

RESULTS_DIR = Path(__file__).parent / "results"

# Documented defaults the scenarios' timings are derived from (docs/CONFIGURATION.md).
LEASE_TTL_S = 4.0
READ_BLOCK_S = 5.0
RECLAIM_INTERVAL_S = 60.0
SSE_KEEPALIVE_S = 15.0
# The routers' streams connections time out this long after a blocking read was due back.
SOCKET_TIMEOUT_MARGIN_S = 5.0

# Raw entries (malformed ones, producer duplicates) are written once even when a reply is lost.
_WRITE_ONCE = """
local first = redis.call('GET', KEYS[2])
if first then
  return first
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV))
redis.call('SET', KEYS[2], id, 'EX', 3600)
return id
"""

EntryKey = tuple[str, str]  # (stream, entry id)
EventKey = tuple[str, int]  # (job id, seq)

_router_names = itertools.count(1)


# --- waiting ---------------------------------------------------------------------------------


async def until(probe: Callable[[], Any], *, timeout_s: float, every_s: float = 0.05) -> bool:
    """Whether `probe` (sync or async) turned truthy within `timeout_s`; never raises on timeout.

    The scenarios write their figures before asserting, so a condition that never came is a
    figure, not an exception.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
        except (RedisError, OSError, httpx.HTTPError):
            value = False
        if value:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)


# --- the servers ----------------------------------------------------------------------------


def family_on(url: str) -> StreamFamily:
    """The scan shards as the routers lay them out on `url` (hash-tagged on a Redis Cluster)."""
    return laid_out(producer_config(domain="scan"), url).family


def open_client(url: str, *, timeout_s: float) -> tuple[RedisClient, list[Redis]]:
    """A client for `url` (one server, a Sentinel group's master or a Redis Cluster) and the
    sentinels' clients it asks, to close with it."""
    if isinstance(parse_redis_url(url), Standalone):
        return Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=1.0), []
    return redis_client(url, socket_timeout_s=timeout_s, client_name="fault-checks")


async def close_client(client: RedisClient, helpers: Iterable[Redis]) -> None:
    await client.aclose()
    for helper in helpers:
        await helper.aclose()


async def mget(client: RedisClient, keys: Sequence[str]) -> list[Any]:
    """GET of every key, in order; on a cluster one MGET per slot."""
    if isinstance(client, RedisCluster):
        return list(await client.mget_nonatomic(list(keys)))
    return list(await client.mget(list(keys)))


def state_key(family: StreamFamily, job_id: str) -> str:
    return JobKeys.in_family(family, job_id).state


# --- the order check -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry as the checks see it; `seq` is None for an entry that is not a valid
    event (it must be dead-lettered, not published)."""

    stream: str
    entry_id: str
    job_id: str | None
    seq: int | None

    @property
    def key(self) -> EntryKey:
        return (self.stream, self.entry_id)

    @property
    def position(self) -> tuple[str, int, int]:
        """Where the entry sits: its stream, then its id (ms, sequence) in append order."""
        ms, _, n = self.entry_id.partition("-")
        return (self.stream, int(ms), int(n or 0))


def owed_in_stream_order(
    entries: Iterable[Entry], abandoned: Iterable[EntryKey] = ()
) -> dict[str, list[Entry]]:
    """Per job, in stream order, the entries a correct router must publish, in that order.

    A job lives on one shard, so its entries have one order: the order they were appended.
    An entry is owed when its seq is higher than every earlier entry's of the job. Only an
    entry the producer itself appended after a higher (or equal) seq is rightly stale or a
    duplicate. An entry destroyed on purpose before any router could read it (`abandoned`) is
    owed to nobody, though its seq still makes later lower ones stale.
    """
    gone = set(abandoned)
    by_job: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        if entry.job_id is not None and entry.seq is not None:
            by_job[entry.job_id].append(entry)
    owed: dict[str, list[Entry]] = {}
    for job, ordered in by_job.items():
        ordered.sort(key=lambda e: e.position)
        top = -1
        owed[job] = []
        for entry in ordered:
            if entry.seq is not None and entry.seq > top:
                top = entry.seq
                if entry.key not in gone:
                    owed[job].append(entry)
    return owed


@dataclass(slots=True)
class OrderCheck:
    """Owed entries never published, and owed entries first published after a later one of
    their job (a client watching live misses those: the gateway never goes back in seq)."""

    never: list[Entry] = field(default_factory=list)
    overtaken: list[Entry] = field(default_factory=list)
    in_order: int = 0

    @property
    def lost(self) -> list[Entry]:
        return [*self.never, *self.overtaken]


def check_order(
    owed: Mapping[str, Sequence[Entry]], published: Sequence[tuple[str, str]]
) -> OrderCheck:
    """Judge `published` ((job id, stream id) in the order Pub/Sub delivered them) against
    `owed`: each owed entry must be published, and first published in stream order."""
    first: dict[tuple[str, str], int] = {}
    for position, key in enumerate(published):
        first.setdefault(key, position)
    check = OrderCheck()
    for job, entries in owed.items():
        later_first = len(published)  # the earliest first publication of any later entry
        verdicts: list[tuple[Entry, str]] = []
        for entry in reversed(entries):
            at = first.get((job, entry.entry_id))
            if at is None:
                verdicts.append((entry, "never"))
                continue
            verdicts.append((entry, "overtaken" if at > later_first else "in order"))
            later_first = min(later_first, at)
        for entry, verdict in reversed(verdicts):
            if verdict == "never":
                check.never.append(entry)
            elif verdict == "overtaken":
                check.overtaken.append(entry)
            else:
                check.in_order += 1
    return check


def entry_from_fields(stream: str, entry_id: str, fields: Mapping[bytes, bytes]) -> Entry:
    """An entry read back from a stream, judged valid or not by the router's own parser."""
    parsed = parse_entry(domain=SCAN.domain, stream=stream, entry_id=entry_id, fields=fields)
    if isinstance(parsed, JobEvent) and _fits(parsed):
        return Entry(stream, entry_id, parsed.job_id, parsed.seq)
    return Entry(stream, entry_id, None, None)


def _fits(event: JobEvent) -> bool:
    """Within the default size limits, as the router measures them."""
    size = len(OrjsonEventEncoder().encode(event))
    return (
        DEFAULT_SIZE_LIMITS.check(
            size, stage=event.stage, status=event.status, has_result=event.has_result
        )
        is None
    )


# --- the routers' environment ----------------------------------------------------------------


def router_env(
    *,
    streams_url: str,
    pubsub_url: str,
    name: str,
    settings: Mapping[str, str],
    release: Path | None = None,
) -> dict[str, str]:
    """A router's environment: the documented defaults, but for the servers' addresses, the
    consumer name, the loopback HTTP address, the gateway's /metrics turned on and `settings`
    (a scenario's shortened ones). `release` is another commit's `src/` (`git archive`), put
    first on PYTHONPATH so the process runs that commit's `eco_router`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVENT_ROUTER_", "REDIS_")) and k != "POD_NAME"
    }
    env |= {
        "REDIS_STREAMS_URL": streams_url,
        "REDIS_PUBSUB_URL": pubsub_url,
        "EVENT_ROUTER_CONSUMER_NAME": name,
        "EVENT_ROUTER_HTTP_HOST": "127.0.0.1",
        "EVENT_ROUTER_HTTP_PORT": "0",
        # The checks read every router's metrics, the gateway's too; routing is unchanged.
        "EVENT_ROUTER_GATEWAY_METRICS": "true",
    }
    if release is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(release), env.get("PYTHONPATH")]))
    return env | dict(settings)


def launch_gateway(log_dir: Path, env: Mapping[str, str]) -> Gateway:
    """`eco-router serve` on a free loopback port, once /ready answers (another port if taken)."""
    name = env["EVENT_ROUTER_CONSUMER_NAME"]
    gateway: Gateway | None = None
    for attempt in range(3):
        port = free_port()
        log_path = log_dir / f"{name}-{attempt}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*Gateway.command(), "serve", "--host", "127.0.0.1", "--port", str(port)],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        gateway = Gateway(process, log_path, name)
        gateway.base_url = f"http://127.0.0.1:{port}"
        if gateway.wait_ready():
            return gateway
    raise AssertionError(f"gateway could not start\n{gateway.log_tail() if gateway else ''}")


# --- the load --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much load a scenario drives, and the settings it shortens (none: the defaults).

    `jobs` run side by side, each a chain of `events`; a job writes its next event once the
    one `window` events back is applied (1: one at a time). The first `backlog` events of every
    job are written at once, in one round trip, before the routers can read any of them.
    """

    name: str
    jobs: int
    events: int
    pace_s: float = 0.05
    malformed: float = 0.0
    duplicates: float = 0.0
    viewers: int = 4
    window: int = 1
    backlog: int = 0
    settings: tuple[tuple[str, str], ...] = ()
    # The producer's `wait_replicas` (0: a write returns once the master has it).
    producer_wait_replicas: int = 0

    def params(self) -> dict[str, Any]:
        hidden = {"name", "settings", "producer_wait_replicas"}
        shown = {k: v for k, v in asdict(self).items() if k not in hidden}
        if self.producer_wait_replicas:
            shown["producer_wait_replicas"] = self.producer_wait_replicas
        settings = [f"{name}={value}" for name, value in self.settings] or "documented defaults"
        return shown | {"size": self.name, "settings": settings}


@dataclass(frozen=True, slots=True)
class Scenario:
    """One fault scenario at one load size; `name` names its result file."""

    number: int
    slug: str
    title: str
    sizes: Sizes

    @property
    def name(self) -> str:
        return f"{self.number:02d}-{self.slug}-{self.sizes.name}"


def bad_entry(reason: RejectReason, job_id: str, token: str) -> dict[str, bytes]:
    """A malformed entry the router must dead-letter with `reason` (`token` tells it apart)."""
    job = job_id.encode()
    wrong: dict[RejectReason, dict[str, bytes]] = {
        RejectReason.MISSING_JOB_ID: {"seq": b"5", "stage": b"vision"},
        RejectReason.INVALID_JOB_ID: {"job_id": b"no spaces allowed", "seq": b"5"},
        RejectReason.MISSING_SEQ: {"job_id": job, "stage": b"vision"},
        RejectReason.SEQ_NOT_INTEGER: {"job_id": job, "seq": b"five"},
        RejectReason.SEQ_NEGATIVE: {"job_id": job, "seq": b"-5"},
        RejectReason.PROGRESS_NOT_INTEGER: {"job_id": job, "seq": b"5", "progress": b"half"},
        RejectReason.NOT_UTF8: {"job_id": job, "seq": b"5", "stage": b"\xff\xfe"},
        RejectReason.RESULT_NOT_JSON: {"job_id": job, "seq": b"5", "result": b"{not json"},
        RejectReason.FIELD_TOO_LARGE: {"job_id": job, "seq": b"5", "result": b"1" * 70_000},
        RejectReason.RESULT_NOT_FINITE: {"job_id": job, "seq": b"5", "result": b"[NaN]"},
        # Escaped six bytes for one: above the default stage-event limit once routed.
        RejectReason.TOO_LARGE: {"job_id": job, "seq": b"5", "note": b"\x01" * 2000},
        RejectReason.MISSING_CONTENT: {"job_id": job, "seq": b"1005", "stage": b"token"},
        RejectReason.ATTEMPT_NOT_INTEGER: {
            "job_id": job,
            "seq": b"1005",
            "stage": b"token",
            "content": b"x",
            "attempt": b"second",
        },
    }
    return {"token": token.encode(), **wrong[reason]}


# Every reason a producer's entry can be rejected for (max_deliveries is the router's own).
MALFORMED_REASONS = tuple(r for r in RejectReason if r is not RejectReason.MAX_DELIVERIES)


class Load:
    """A producer driving `sizes.jobs` jobs at once, each appending its events in seq order.

    Pipelines emit a job's stages one after the other: a job never appends a seq below one it
    appended before, so every valid event it writes is owed a publish, in stream order.
    Malformed entries and duplicates (a retry outside the producer's idempotency window: the
    same seq again, rightly not published) are mixed in at the configured shares. Every entry
    written is recorded with its stream id, so the order check knows entries trimmed since.
    With `producer_wait_replicas` every write waits for that many replicas, as the producer
    SDK's does, and one the replicas did not acknowledge in time is retried until they do.
    """

    def __init__(self, url: str, sizes: Sizes, *, stem: str, seed: int = 7) -> None:
        self.sizes = sizes
        self._redis, self._helpers = open_client(url, timeout_s=2.0)
        self._config = laid_out(
            producer_config(domain="scan", wait_replicas=sizes.producer_wait_replicas), url
        )
        self.family = self._config.family
        self._wait = ReplicaWait(self._config.wait_replicas, self._config.wait_timeout_ms)
        self._append_once = self._redis.register_script(load_lua("append_once.lua"))
        self._write_once = self._redis.register_script(_WRITE_ONCE)
        self._rng = random.Random(seed)
        self.jobs = [f"{stem}-{n:03d}" for n in range(sizes.jobs)]
        self.written: dict[EntryKey, Entry] = {}
        self.events: dict[EventKey, EntryKey] = {}
        self.abandoned: set[EntryKey] = set()
        # Entries acknowledged to the producer that the streams server lost in a failover.
        self.vanished: set[EntryKey] = set()
        self.malformed: dict[EntryKey, str] = {}
        self.applied: dict[str, int] = {}
        self._tokens = itertools.count(1)
        self._stem = stem
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._watch: asyncio.Task[None] | None = None
        self._bad_slots = self._plan_malformed()
        self._job_rngs = {job: random.Random(self._rng.random()) for job in self.jobs}
        self.errors: list[str] = []
        # redis-py's errors on a connection closed under a command, retried as transient.
        self.client_errors: Counter[str] = Counter()

    # -- what was written --

    @property
    def sent(self) -> set[EntryKey]:
        return set(self.written)

    def owed(self) -> dict[str, list[Entry]]:
        """Per job, the entries written so far that must be published, in stream order."""
        return owed_in_stream_order(self.written.values(), self.abandoned)

    @property
    def expected(self) -> set[EventKey]:
        """(job, seq) of every owed entry written so far."""
        return {(job, e.seq) for job, owed in self.owed().items() for e in owed if e.seq}

    def highest(self) -> dict[str, int]:
        """Each job's highest owed seq: where its state must end."""
        return {job: seq for job, owed in self.owed().items() if owed and (seq := owed[-1].seq)}

    def applied_keys(self) -> set[EventKey]:
        """The owed events the state store has applied (a job's state reached their seq)."""
        return {(job, seq) for job, seq in self.expected if self.applied.get(job, -1) >= seq}

    @property
    def routed(self) -> int:
        return sum(self.applied.values())

    @property
    def total_events(self) -> int:
        return self.sizes.jobs * self.sizes.events

    # -- running --

    async def start(self) -> None:
        """The backlog (if any) in one round trip, then every job on its own."""
        self._watch = asyncio.create_task(self._watch_states(), name="load-watch")
        if self.sizes.backlog:
            await self._write_backlog()
        self._tasks = [
            asyncio.create_task(self._job(job, self._job_rngs[job]), name=job) for job in self.jobs
        ]

    def abandon(self, keys: Iterable[EntryKey]) -> None:
        """Entries a scenario destroyed before any router could read them: owed to nobody."""
        self.abandoned.update(keys)
        self._changed.set()

    def vanish(self, keys: Iterable[EntryKey]) -> None:
        """Entries the streams server lost after acknowledging them: still owed (a loss if
        never published), but their jobs go on without waiting for them to be applied."""
        self.vanished.update(keys)
        self._changed.set()

    def vanished_ids(self) -> set[tuple[str | None, str]]:
        """(job id, stream id) of the vanished entries, as publishes name them."""
        return {(e.job_id, e.entry_id) for key, e in self.written.items() if key in self.vanished}

    @property
    def done(self) -> bool:
        return bool(self._tasks) and all(t.done() for t in self._tasks)

    async def until_routed(self, share: float, timeout_s: float = 30.0) -> bool:
        """Until `share` of all the load's events are applied (the moment to inject a fault)."""
        return await until(
            lambda: self.routed >= share * self.total_events, timeout_s=timeout_s, every_s=0.02
        )

    async def finish(self, timeout_s: float) -> bool:
        """Whether every job published all its events within `timeout_s`."""
        finished = await until(lambda: self.done, timeout_s=timeout_s)
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.errors.append(repr(task.exception()))
        return finished and not self.errors

    async def aclose(self) -> None:
        # Sure to end: a task that drops its cancel (see cancel_and_wait) would wait forever.
        await cancel_and_wait([t for t in [*self._tasks, self._watch] if t is not None])
        await close_client(self._redis, self._helpers)

    # -- internals --

    def _plan_malformed(self) -> dict[EventKey, list[RejectReason]]:
        """Where malformed entries go, so they are `sizes.malformed` of all entries written."""
        good = self.total_events * (1 + self.sizes.duplicates)
        share = self.sizes.malformed
        count = round(share * good / (1 - share)) if share else 0
        slots: dict[EventKey, list[RejectReason]] = defaultdict(list)
        keys = [(job, seq) for job in self.jobs for seq in range(1, self.sizes.events + 1)]
        for n in range(count):
            slots[self._rng.choice(keys)].append(MALFORMED_REASONS[n % len(MALFORMED_REASONS)])
        return slots

    def _stage(self, job: str, seq: int) -> functools.partial[Any]:
        last = self.sizes.events
        stage, status = ("done", "done") if seq == last else (f"stage-{seq}", "completed")
        event = StageEvent(job, stage, status, seq=seq, progress=min(100, seq * 100 // last))
        return functools.partial(self._config.stage_event, event)

    async def _job(self, job: str, rng: random.Random) -> None:
        first = self.sizes.backlog + 1
        for seq in range(first, self.sizes.events + 1):
            await self._until_settled(job, seq - self.sizes.window)
            if seq > first or self.sizes.backlog:
                await asyncio.sleep(self.sizes.pace_s * rng.uniform(0.5, 1.5))
            for reason in self._bad_slots.get((job, seq), []):
                await self._write_malformed(job, reason)
            prepared = self._stage(job, seq)()
            entry_id = await self._retry(functools.partial(self._append, prepared))
            self._record_event(job, seq, prepared.stream, entry_id)
            if rng.random() < self.sizes.duplicates:
                await self._write_duplicate(job, seq)
        await self._until_settled(job, self.sizes.events)

    async def _write_backlog(self) -> None:
        """The first `backlog` events of every job, interleaved, in one pipeline."""
        written: list[tuple[str, str, int, str]] = []  # kind, job, seq, reason
        async with self._redis.pipeline(transaction=False) as pipe:
            for seq in range(1, self.sizes.backlog + 1):
                for job in self.jobs:
                    for reason in self._bad_slots.get((job, seq), []):
                        token = f"{self._stem}-bad-{next(self._tokens)}"
                        fields = bad_entry(reason, job, token)
                        stream = self.family.stream_for(job)
                        await self._append_raw(stream, token, fields, pipe)
                        written.append(("bad", job, 0, reason.value))
                    await self._append(self._stage(job, seq)(), pipe)
                    written.append(("event", job, seq, ""))
            replies = await pipe.execute()
        for (kind, job_id, event_seq, why), reply in zip(written, replies, strict=True):
            entry_id = reply.decode() if isinstance(reply, bytes) else str(reply)
            stream = self.family.stream_for(job_id)
            if kind == "bad":
                self._record_malformed(stream, entry_id, why)
            else:
                self._record_event(job_id, event_seq, stream, entry_id)

    async def _append(self, prepared: PreparedEntry, pipe: Any = None) -> Any:
        """Append an event as the producer does (once per idempotency key)."""
        keys, args = script_arguments(prepared, self._config)
        if pipe is not None:
            return await self._append_once(keys=keys, args=args, client=pipe)
        return await self._wait.call(self._redis, self._append_once, keys, args)

    async def _append_raw(
        self, stream: str, token: str, fields: Mapping[str, bytes], pipe: Any = None
    ) -> Any:
        """Append fields byte for byte, once per `token`."""
        # On a cluster a script's keys must share a slot: the marker takes the stream's tag.
        tag = hash_tag(stream)
        marker = f"faults:once:{{{tag}}}:{token}" if tag else f"faults:once:{token}"
        keys, args = [stream, marker], _flat(fields)
        if pipe is not None:
            return await self._write_once(keys=keys, args=args, client=pipe)
        return await self._wait.call(self._redis, self._write_once, keys, args)

    def _record_event(self, job: str, seq: int, stream: str, entry_id: str) -> None:
        self.events.setdefault((job, seq), (stream, entry_id))
        self.written[(stream, entry_id)] = Entry(stream, entry_id, job, seq)

    def _record_malformed(self, stream: str, entry_id: str, reason: str) -> None:
        self.malformed[(stream, entry_id)] = reason
        self.written[(stream, entry_id)] = Entry(stream, entry_id, None, None)

    async def _until_settled(self, job: str, seq: int) -> None:
        """Until the job's state reached `seq`, or that event was destroyed on purpose."""
        while seq > 0 and self.applied.get(job, -1) < seq:
            if self.events.get((job, seq)) in self.abandoned | self.vanished:
                return
            self._changed.clear()
            await self._changed.wait()

    async def _watch_states(self) -> None:
        """One MGET of every job's state at a time, waking the jobs whose event was applied."""
        keys = [state_key(self.family, job) for job in self.jobs]
        while True:
            try:
                states = await mget(self._redis, keys)
            except (RedisError, OSError):
                await asyncio.sleep(0.1)
                continue
            except CLOSED_ERRORS as error:
                # A read on a connection closed under it (redis-py passes these on raw).
                if not closed_under_command(error):
                    raise
                await asyncio.sleep(0.1)
                continue
            for job, raw in zip(self.jobs, states, strict=True):
                if raw is not None:
                    self.applied[job] = int(orjson.loads(raw)["seq"])
            self._changed.set()
            await asyncio.sleep(0.02)

    async def retry_applied(self) -> int:
        """For every started job, its last applied event appended again, as a producer
        retrying outside its idempotency window does (the same seq, a new entry), and an
        event at seq 0, below every seq it wrote, as one delivered late: neither is owed a
        publish. Returns how many entries were appended."""
        applied = [(job, seq) for job, seq in self.applied.items() if seq > 0]
        for job, seq in applied:
            await self._write_duplicate(job, seq)
            await self._write_duplicate(job, 0)
        return 2 * len(applied)

    async def _write_malformed(self, job: str, reason: RejectReason) -> None:
        token = f"{self._stem}-bad-{next(self._tokens)}"
        stream = self.family.stream_for(job)
        entry_id = await self._write_raw(stream, token, bad_entry(reason, job, token))
        self._record_malformed(stream, entry_id, reason.value)

    async def _write_duplicate(self, job: str, seq: int) -> None:
        token = f"{self._stem}-dup-{next(self._tokens)}"
        prepared = self._stage(job, seq)()
        fields = {name: value.encode() for name, value in prepared.fields.items()}
        stream = self.family.stream_for(job)
        entry_id = await self._write_raw(stream, token, fields)
        self.written[(stream, entry_id)] = Entry(stream, entry_id, job, seq)

    async def _write_raw(self, stream: str, token: str, fields: Mapping[str, bytes]) -> str:
        return await self._retry(functools.partial(self._append_raw, stream, token, fields))

    async def _retry(self, call: Callable[[], Awaitable[Any]], timeout_s: float = 60.0) -> str:
        """Call until the server answers (it may be down or unreachable for a while)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = await call()
            except (RedisError, OSError, ReplicasBehind):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            except AttributeError as error:
                # What a producer on a cluster sees in a failover (the SDK passes it on).
                if not closed_under_command(error) or time.monotonic() > deadline:
                    raise
                self.client_errors[repr(error)] += 1
                await asyncio.sleep(0.1)
                continue
            return reply.decode() if isinstance(reply, bytes) else str(reply)


def _flat(fields: Mapping[str, bytes]) -> list[str | bytes]:
    args: list[str | bytes] = []
    for name, value in fields.items():
        args += (name, value)
    return args


# --- SSE viewers -----------------------------------------------------------------------------


class Viewer:
    """A browser tab watching one job through the gateway.

    When the stream drops it reconnects with the last id it got as Last-Event-ID, as
    EventSource does, until it receives the job's terminal event (or is cancelled). Three
    keepalive intervals without a byte mean a dead connection.
    """

    def __init__(self, base_url: Callable[[], str], job_id: str, *, keepalive_s: float) -> None:
        self._base_url = base_url
        self.job_id = job_id
        self.seqs: list[int] = []
        self.connections = 0
        self.finished = False
        self._timeout_s = 3 * keepalive_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"viewer-{self.job_id}")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    @property
    def duplicates(self) -> int:
        return len(self.seqs) - len(set(self.seqs))

    @property
    def in_order(self) -> bool:
        return all(a < b for a, b in itertools.pairwise(self.seqs))

    def reached(self, seq: int) -> bool:
        return self.finished or (bool(self.seqs) and self.seqs[-1] >= seq)

    async def _run(self) -> None:
        path = f"/api/v1/scan/{self.job_id}/events"
        timeout = httpx.Timeout(self._timeout_s)
        while not self.finished:
            headers = {"Last-Event-ID": str(self.seqs[-1])} if self.seqs else {}
            self.connections += 1
            with contextlib.suppress(httpx.HTTPError):
                async with (
                    httpx.AsyncClient(
                        base_url=self._base_url(), timeout=timeout, trust_env=False
                    ) as http,
                    open_sse(http, path, headers=headers) as stream,
                ):
                    if stream.status_code == 200:
                        await self._read(stream)
            if not self.finished:
                await asyncio.sleep(0.2)

    async def _read(self, stream: SseStream) -> None:
        while (event := await stream.next_event(timeout_s=3600)) is not None:
            if event.id is None:  # a snapshot, or the end of a too-long wait
                continue
            self.seqs.append(event.seq)
            if event.terminal:
                self.finished = True
                return


# --- figures ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Figures:
    """One scenario's result file (`tests/faults/results/<scenario>.json`).

    `expected` counts the entries owed a publish; `published` those published in stream order;
    `lost` the owed entries never published, published after a later entry of their job, or
    missing at an SSE client watching their job. `recovery_s` runs from `recovery_from`.
    """

    scenario: str
    title: str
    params: dict[str, Any]
    sent: int = 0
    expected: int = 0
    published: int = 0
    lost: int = 0
    duplicated_to_clients: int = 0
    dead_lettered: int = 0
    recovery_s: float = 0.0
    recovery_from: str = ""
    passed: bool = False
    # Of `lost`: events the producer was told were written, lost with a master before any
    # replica had them (asynchronous replication allows it; only where the scenario says so).
    lost_unreplicated: int = 0

    def write(self) -> Path:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.scenario}.json"
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=False) + "\n")
        return path


@dataclass(slots=True)
class Findings:
    """What the final checks found, beyond the figures; empty lists mean the invariant holds."""

    never_published: list[Entry] = field(default_factory=list)
    overtaken: list[Entry] = field(default_factory=list)
    missed_by_viewers: dict[str, list[int]] = field(default_factory=dict)
    unexpected: list[tuple[str, str]] = field(default_factory=list)
    wrong_states: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    pending: int = 0
    # Per shard with entries left pending: its group's last delivered id and those entries.
    pending_detail: dict[str, str] = field(default_factory=dict)
    dead_letters_missing: list[EntryKey] = field(default_factory=list)
    dead_letters_extra: list[EntryKey] = field(default_factory=list)
    wrong_reasons: dict[EntryKey, tuple[str, str]] = field(default_factory=dict)
    viewer_duplicates: dict[str, list[int]] = field(default_factory=dict)
    viewers_out_of_order: dict[str, list[int]] = field(default_factory=dict)
    viewers_behind: dict[str, list[int]] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(getattr(self, f.name) for f in dataclasses.fields(self))

    def lost_keys(self) -> set[EventKey]:
        """Every owed (job, seq) lost on the way to Pub/Sub or to a watching client."""
        lost = {(e.job_id, e.seq) for e in [*self.never_published, *self.overtaken]}
        lost |= {(job, seq) for job, seqs in self.missed_by_viewers.items() for seq in seqs}
        return {(job, seq) for job, seq in lost if job is not None and seq is not None}


# --- the rig ---------------------------------------------------------------------------------


class FaultRig:
    """Router processes (workers and one gateway) on a pair of servers, plus the observers.

    `router_streams_url` / `router_pubsub_url` are what the routers dial (a relay in some
    scenarios); the producer, the collector and the checks always reach the servers directly.
    Routers run with the documented defaults but for the scenario size's `settings`. The URLs
    may name one server, a Sentinel group or a Redis Cluster (tagged shards there); `observe`
    makes the collector of publishes for the load's jobs (default: a pattern subscriber on
    the one Pub/Sub server).
    """

    def __init__(
        self,
        log_dir: Path,
        scenario: Scenario,
        *,
        streams_url: str,
        pubsub_url: str,
        router_streams_url: str | None = None,
        router_pubsub_url: str | None = None,
        observe: Callable[[Sequence[str]], Collector] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.sizes = scenario.sizes
        self.settings = dict(scenario.sizes.settings)
        self.streams_url = streams_url
        self.pubsub_url = pubsub_url
        self.router_streams_url = router_streams_url or streams_url
        self.router_pubsub_url = router_pubsub_url or pubsub_url
        self.workers: list[WorkerProcess] = []
        self.gateways: list[Gateway] = []
        self.family = family_on(streams_url)
        self.redis, self._helpers = open_client(streams_url, timeout_s=5.0)
        self.load = Load(streams_url, scenario.sizes, stem=f"{scenario.number:02d}-job")
        self.collector: Collector = (
            observe(self.load.jobs) if observe is not None else PubSubCollector(pubsub_url)
        )
        # Whether an acknowledged entry the streams server lost in a failover, and so never
        # published, is a measured loss (asynchronous replication allows it) or a failure.
        self.unreplicated_loss_allowed = False
        self.viewers: list[Viewer] = []
        self.figures = Figures(
            scenario=scenario.name, title=scenario.title, params=scenario.sizes.params()
        )
        self.findings = Findings()
        # Entries a scenario wrote itself, beside the load (`load.abandon` takes them too).
        self.own_entries: dict[EntryKey, Entry] = {}
        self._recovery: asyncio.Task[None] | None = None
        self._recovered = False
        # Consumers of the group besides the routers this rig started (a scenario's own).
        self.known_consumers: set[str] = set()
        self._collecting = False

    # -- set-up --

    async def start(self, *, workers: int = 2, release: Path | None = None) -> list[WorkerProcess]:
        """The collector, `workers` workers and the gateway (of `release`, see `router_env`);
        returns the workers once ready."""
        await self.collector.__aenter__()
        self._collecting = True
        started = [self.spawn_worker(release) for _ in range(workers)]
        await self.start_gateway(release)
        await asyncio.gather(*(w.until_ready() for w in started))
        return started

    def spawn_worker(
        self, release: Path | None = None, *, pubsub_url: str | None = None
    ) -> WorkerProcess:
        """A worker of `release` (see `router_env`), dialing `pubsub_url` if given."""
        name = f"worker-{next(_router_names)}"
        env = self._env(name, release)
        if pubsub_url is not None:
            env["REDIS_PUBSUB_URL"] = pubsub_url
        worker = WorkerProcess.spawn(env, self.log_dir / f"{name}.log")
        self.workers.append(worker)
        return worker

    async def start_worker(
        self, release: Path | None = None, *, pubsub_url: str | None = None
    ) -> WorkerProcess:
        return await self.spawn_worker(release, pubsub_url=pubsub_url).until_ready()

    async def start_gateway(self, release: Path | None = None) -> Gateway:
        """A gateway that takes over the address viewers (re)connect to, as behind a balancer."""
        env = self._env(f"gateway-{next(_router_names)}", release)
        gateway = await asyncio.to_thread(launch_gateway, self.log_dir, env)
        self.gateways.append(gateway)
        return gateway

    def _env(self, name: str, release: Path | None = None) -> dict[str, str]:
        # The load is scan jobs: the default chat family's shards (the chat rows' load, in
        # tests/faults/chat.py) would only spread the routers' leases over shards that hold
        # nothing, and a router killed or paused there would hold no entry to take over.
        return router_env(
            streams_url=self.router_streams_url,
            pubsub_url=self.router_pubsub_url,
            name=name,
            settings={"EVENT_ROUTER_STREAMS": "scan:events=4", **self.settings},
            release=release,
        )

    @property
    def gateway(self) -> Gateway:
        """The gateway new connections go to (the latest started)."""
        assert self.gateways, "no gateway started"
        return self.gateways[-1]

    async def start_load(self) -> None:
        """Viewers on the first jobs first (so they see each job whole), then the load."""
        keepalive_s = float(self.settings.get("EVENT_ROUTER_SSE_KEEPALIVE_S", SSE_KEEPALIVE_S))
        for job in self.load.jobs[: self.sizes.viewers]:
            viewer = Viewer(lambda: self.gateway.base_url, job, keepalive_s=keepalive_s)
            viewer.start()
            self.viewers.append(viewer)
        await self.load.start()

    @property
    def routers(self) -> list[WorkerProcess]:
        """Every router process still running (workers and the gateway)."""
        everyone = [*self.workers, *self.gateways]
        return [p for p in everyone if p.exit_code is None]

    async def metric_sum(self, sample: str, **labels: str) -> float:
        """A metric summed over every running router."""
        values = await asyncio.gather(*(p.metric(sample, **labels) for p in self.routers))
        return sum(values)

    async def pending_of(self, consumer: str) -> int:
        return (await pending_by_consumer(self.redis, self.family.streams)).get(consumer, 0)

    async def lease_owners(self) -> dict[str, str]:
        """Stream → the router holding its lease now, as the streams server has it."""
        keys = GroupKeys(GROUP)
        owners = {}
        for stream in self.family.streams:
            owner = await self.redis.hget(keys.lease(stream), "owner")
            if owner is not None:
                owners[stream] = owner.decode()
        return owners

    def unpublished(self, streams: Iterable[str] | None = None) -> int:
        """Owed entries written so far (on `streams`) that no router has published yet."""
        wanted = set(self.family.streams if streams is None else streams)
        published = self.published_entries()
        return sum(
            1
            for owed in self.load.owed().values()
            for e in owed
            if e.stream in wanted and (e.job_id, e.entry_id) not in published
        )

    def published_entries(self) -> set[tuple[str, str]]:
        """(job id, stream id) of every entry published so far (ids repeat across shards;
        a job lives on one shard)."""
        return {
            (str(m.payload["job_id"]), str(m.payload["stream_id"])) for m in self.collector.messages
        }

    def _owed_now(self) -> set[tuple[str, str]]:
        """(job id, stream id) of the entries written so far that are owed a publish."""
        return {(job, e.entry_id) for job, owed in self.load.owed().items() for e in owed}

    async def find_vanished(self) -> set[EntryKey]:
        """Entries the producer was told were written that the streams server no longer has
        (a master lost before its replicas had them); the load stops waiting for them."""
        written = set(self.load.written)
        found: set[EntryKey] = set()
        for stream in self.family.streams:
            found |= {(stream, raw.decode()) for raw, _ in await self.redis.xrange(stream)}
        vanished = written - found
        self.load.vanish(vanished)
        return vanished

    # -- the fault and the recovery --

    def recover_from(
        self,
        origin: str,
        *,
        at: float | None = None,
        also: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Start the recovery clock at `at` (a `time.monotonic()`; default now), named `origin`.

        Recovered means: every entry owed a publish written by then is published, every
        malformed entry written by then is dead-lettered, and the scenario's own condition
        (`also`) holds.
        """
        started = time.monotonic() if at is None else at
        self.figures.recovery_from = origin
        recovered = self._recovered_condition(also)

        async def clock() -> None:
            if await until(recovered, timeout_s=600):
                self.figures.recovery_s = round(time.monotonic() - started, 3)
                self._recovered = True

        self._recovery = asyncio.create_task(clock(), name="recovery-clock")

    async def time_to_recover(self, started: float, *, timeout_s: float = 120.0) -> float:
        """Seconds from `started` (a `time.monotonic()`) until recovered, as `recover_from`
        defines it; for a scenario that times several faults one after the other."""
        recovered = self._recovered_condition(None)
        self.require(await until(recovered, timeout_s=timeout_s), "no recovery from a fault")
        return round(time.monotonic() - started, 3)

    def _recovered_condition(
        self, also: Callable[[], Awaitable[bool]] | None
    ) -> Callable[[], Awaitable[bool]]:
        owed = self._owed_now()
        malformed = set(self.load.malformed)

        async def holds() -> bool:
            # What a failover lost before any router read it can never be routed; the
            # scenario judges that loss itself.
            if not (owed & self._owed_now()) - self.load.vanished_ids() <= self.published_entries():
                return False
            if not {key for key, _ in await self.dead_letters()} >= malformed - self.load.vanished:
                return False
            return also is None or await also()

        return holds

    # -- the end --

    async def settle(self, *, timeout_s: float = 60.0, drain_timeout_s: float = 20.0) -> Figures:
        """Let the load finish and the system drain, then take the figures and the findings.

        `drain_timeout_s` bounds the wait for nothing pending (longer where entries wait for
        the reclaimer's default idle time).
        """
        findings = self.findings
        if not await self.load.finish(timeout_s):
            findings.load_errors = self.load.errors or [
                f"load unfinished: {self.load.routed}/{self.load.total_events} events applied"
            ]
        owed_now = self._owed_now() - self.load.vanished_ids()
        await until(lambda: owed_now <= self.published_entries(), timeout_s=20)
        await until(self._nothing_pending, timeout_s=drain_timeout_s)
        await until(self._dead_letters_complete, timeout_s=10)
        highest = self.load.highest()
        await until(
            lambda: all(v.reached(highest.get(v.job_id, 0)) for v in self.viewers), timeout_s=20
        )
        if self._recovery is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await asyncio.shield(self._recovery)
            self._recovery.cancel()
        if not self._recovered:
            findings.extra.append("never recovered from the fault (or it never ended)")

        ledger = await self.ledger()
        abandoned = self.load.abandoned
        published = [
            (str(m.payload["job_id"]), str(m.payload["stream_id"])) for m in self.collector.messages
        ]
        unreplicated = self._unreplicated(ledger) if self.unreplicated_loss_allowed else {}
        # The rest is judged on what the streams server kept (an event lost with the master
        # that the producer wrote again later is owed from that entry).
        kept = [e for key, e in ledger.items() if key not in unreplicated]
        owed = owed_in_stream_order(kept, abandoned)
        order = check_order(owed, published)
        findings.never_published = order.never
        findings.overtaken = order.overtaken
        owed_ids = {(job, e.entry_id) for job, entries in owed.items() for e in entries}
        gone_ids = {(e.job_id, e.entry_id) for key, e in ledger.items() if key in abandoned}
        findings.unexpected = sorted(set(published) - owed_ids - gone_ids)
        highest = {
            job: seq for job, entries in owed.items() if entries and (seq := entries[-1].seq)
        }
        findings.pending = await pending_count(self.redis, self.family.streams)
        if findings.pending:
            findings.pending_detail = await self._pending_detail()
        state_highest = highest
        if self.unreplicated_loss_allowed:
            # A job's state is where the entries the server kept took it: one published
            # before the failover and lost with the master took its state write along.
            vanished = self.load.vanished
            state_highest = {
                job: seq
                for job, entries in owed.items()
                if (kept_here := [e for e in entries if e.key not in vanished])
                and (seq := kept_here[-1].seq)
            }
        foreign = await self._consumers() - self._our_consumers()
        if foreign:
            findings.extra.append(f"consumers this test did not start joined: {foreign}")
        if findings.pending:
            findings.extra.append(f"still pending: {await self._pending_details()}")
        await self._check_states(state_highest)
        await self._check_dead_letters(excused=set(unreplicated))
        for viewer in self.viewers:
            seqs = {e.seq for e in owed.get(viewer.job_id, []) if e.seq is not None}
            missed = sorted(seqs - set(viewer.seqs))
            if missed:
                findings.missed_by_viewers[viewer.job_id] = missed
            if viewer.duplicates:
                findings.viewer_duplicates[viewer.job_id] = viewer.seqs
            if not viewer.in_order:
                findings.viewers_out_of_order[viewer.job_id] = viewer.seqs
            if not viewer.reached(highest.get(viewer.job_id) or 0):
                findings.viewers_behind[viewer.job_id] = viewer.seqs

        figures = self.figures
        figures.params |= {
            "sse_clients": len(self.viewers),
            "sse_events_received": sum(len(v.seqs) for v in self.viewers),
            "sse_reconnects": sum(v.connections - 1 for v in self.viewers),
            "lost_never_published": len(order.never),
            "lost_overtaken_by_a_later_entry": len(order.overtaken),
            "lost_at_sse_clients": sum(len(s) for s in findings.missed_by_viewers.values()),
        }
        figures.sent = len(ledger)
        figures.expected = len(owed_ids)
        figures.published = order.in_order
        lost_events = {(e.job_id, e.seq) for e in unreplicated.values() if e.seq is not None}
        published_events = {
            (str(m.payload["job_id"]), int(m.payload["seq"])) for m in self.collector.messages
        }
        lost_unreplicated = lost_events - published_events
        figures.lost = len(findings.lost_keys() | lost_unreplicated)
        figures.lost_unreplicated = len(lost_unreplicated)
        if self.load.client_errors:
            errors = sorted(self.load.client_errors.items())
            figures.params |= {
                "producer_redis_py_errors_retried": [f"{n} x {e}" for e, n in errors]
            }
        if self.load.vanished:
            figures.params |= {
                "acknowledged_entries_gone_after_failover": len(self.load.vanished),
                "malformed_gone_before_routing": sum(e.seq is None for e in unreplicated.values()),
            }
        figures.duplicated_to_clients = sum(v.duplicates for v in self.viewers)
        figures.dead_lettered = len(await self.dead_letters())
        return figures

    async def ledger(self) -> dict[EntryKey, Entry]:
        """Every entry of the scan shards: what XRANGE finds now, what the load and the
        scenario wrote (some may have been trimmed since). The load's own record wins: it
        knows which entries it wrote malformed."""
        found: dict[EntryKey, Entry] = {}
        for stream in self.family.streams:
            for raw_id, fields in await self.redis.xrange(stream):
                entry_id = raw_id.decode()
                found[(stream, entry_id)] = entry_from_fields(stream, entry_id, fields)
        mismatched = [
            key for key, entry in self.load.written.items() if key in found and found[key] != entry
        ]
        if mismatched:
            self.findings.extra.append(f"entries not as the load wrote them: {mismatched[:5]}")
        return found | self.own_entries | self.load.written

    def require(self, condition: bool, what: str) -> None:
        """A scenario's own check, recorded with the invariants (and failing the test with them)."""
        if not condition:
            self.findings.extra.append(what)

    def conclude(self) -> None:
        """Write the result file, then assert the three invariants and the scenario's checks."""
        findings, figures = self.findings, self.figures
        figures.passed = findings.ok
        figures.write()
        logs = "\n".join(p.log_tail(15) for p in [*self.workers, *self.gateways])
        assert not findings.load_errors, (findings.load_errors, logs)
        # Nothing lost: every owed entry published, in stream order, and seen by its viewers
        # (but for what a failover lost unreplicated, where the scenario allows it).
        assert not findings.never_published, (findings.never_published[:20], logs)
        assert not findings.overtaken, (findings.overtaken[:20], logs)
        assert not findings.missed_by_viewers, findings.missed_by_viewers
        assert figures.lost == figures.lost_unreplicated
        assert not findings.unexpected, findings.unexpected[:20]
        assert not findings.wrong_states, findings.wrong_states
        # No duplicate reaches a client.
        assert figures.duplicated_to_clients == 0, findings.viewer_duplicates
        assert not findings.viewers_out_of_order, findings.viewers_out_of_order
        assert not findings.viewers_behind, findings.viewers_behind
        # Nothing stranded.
        assert findings.pending == 0, (findings.pending_detail, logs)
        assert not findings.dead_letters_missing, findings.dead_letters_missing
        assert not findings.dead_letters_extra, (findings.dead_letters_extra, logs)
        assert not findings.wrong_reasons, findings.wrong_reasons
        assert not findings.extra, findings.extra
        assert figures.passed

    async def aclose(self) -> None:
        for viewer in self.viewers:
            await viewer.aclose()
        await self.load.aclose()
        if self._recovery is not None:
            self._recovery.cancel()
        if self._collecting:
            await self.collector.__aexit__(None, None, None)
        for worker in self.workers:
            worker.ensure_dead()
        for gateway in self.gateways:
            await asyncio.to_thread(gateway.stop)
        await close_client(self.redis, self._helpers)

    # -- internals --

    def _our_consumers(self) -> set[str]:
        return {p.name for p in [*self.workers, *self.gateways]} | self.known_consumers

    def _unreplicated(self, ledger: Mapping[EntryKey, Entry]) -> dict[EntryKey, Entry]:
        """Entries lost with a master before any router published them."""
        published = self.published_entries()
        return {
            key: entry
            for key, entry in ledger.items()
            if key in self.load.vanished and (entry.job_id, entry.entry_id) not in published
        }

    async def _consumers(self) -> set[str]:
        """Every consumer of the group, on every shard."""
        names = set()
        for stream in self.family.streams:
            for consumer in await self.redis.xinfo_consumers(stream, GROUP):
                names.add(consumer["name"].decode())
        return names

    async def _pending_details(self) -> list[tuple[str, str, str, int, dict[bytes, bytes]]]:
        """(stream, id, consumer, deliveries, fields) of every pending entry, for the report."""
        details = []
        for stream in self.family.streams:
            for item in await self.redis.xpending_range(stream, GROUP, "-", "+", 100):
                entry_id = item["message_id"].decode()
                found = await self.redis.xrange(stream, entry_id, entry_id)
                fields = found[0][1] if found else {}
                consumer = item["consumer"].decode()
                details.append((stream, entry_id, consumer, item["times_delivered"], fields))
        return details

    async def _pending_detail(self) -> dict[str, str]:
        """What is left pending on each shard, and where the group's reads stand there."""
        detail: dict[str, str] = {}
        for stream in self.family.streams:
            left = await self.redis.xpending_range(stream, GROUP, min="-", max="+", count=20)
            if not left:
                continue
            groups = await self.redis.xinfo_groups(stream)
            names = (GROUP, GROUP.encode())
            last = next((g["last-delivered-id"] for g in groups if g["name"] in names), None)
            entries = [
                f"{e['message_id']} at {e['consumer']} x{e['times_delivered']}" for e in left
            ]
            detail[stream] = f"last delivered {last}; pending {entries}"
        return detail

    async def _nothing_pending(self) -> bool:
        return await pending_count(self.redis, self.family.streams) == 0

    async def dead_letters(self) -> list[tuple[EntryKey, str]]:
        raw = await self.redis.xrange(self.family.dead_letter_stream)
        letters = [read_dead_letter(i.decode(), fields) for i, fields in raw]
        return [((d.stream, d.entry_id), d.reason) for d in letters]

    async def _dead_letters_complete(self) -> bool:
        expected = set(self.load.malformed) - self.load.vanished
        return {key for key, _ in await self.dead_letters()} >= expected

    async def _check_states(self, highest: Mapping[str, int]) -> None:
        jobs = sorted(highest)
        keys = [state_key(self.family, job) for job in jobs]
        raw = await mget(self.redis, keys) if jobs else []
        for job, value in zip(jobs, raw, strict=True):
            seq = None if value is None else int(orjson.loads(value)["seq"])
            if seq != highest[job]:
                self.findings.wrong_states[job] = (highest[job], seq)

    async def _check_dead_letters(self, *, excused: set[EntryKey]) -> None:
        """Exactly the malformed entries dead-lettered, each once (`excused`: lost with a
        master before any router read them)."""
        letters = await self.dead_letters()
        held = {key for key, _ in letters}
        malformed = self.load.malformed
        self.findings.dead_letters_missing = sorted(set(malformed) - held - excused)
        self.findings.dead_letters_extra = sorted(held - set(malformed))
        for key, reason in letters:
            if key in malformed and malformed[key] != reason:
                self.findings.wrong_reasons[key] = (malformed[key], reason)
