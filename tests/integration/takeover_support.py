"""The rig of the take-over scenarios: workers on the documented defaults, a paced producer,
pauses that catch a worker holding entries, and the checks every scenario ends with.

Everything is observed from outside the workers, as an operator would: what reached a
Pub/Sub subscriber (and when), what the group holds pending, who the lease hashes name, and
what the workers' /metrics and exit codes say.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis

from eco_router.domain.progress import DEFAULT_STAGES
from eco_router.producer import AsyncStreamPublisher, producer_config
from tests.integration.support import (
    CHANNEL_PREFIX,
    GROUP,
    SCAN,
    PubSubCollector,
    WorkerProcess,
    eventually,
    pending_count,
)

# (stage, status, seq, progress) of one job's pipeline, in the order a producer writes them:
# the producer SDK's seq rule with its default stages (queued 0, n·10 / n·10+1, done 51).
STEPS: tuple[tuple[str, str, int, int], ...] = (
    ("queued", "queued", 0, 0),
    *(
        (stage, status, (n + 1) * 10 + offset, (n * 2 + offset + 1) * 100 // 9)
        for n, stage in enumerate(DEFAULT_STAGES)
        for status, offset in (("started", 0), ("completed", 1))
    ),
    ("done", "done", (len(DEFAULT_STAGES) + 1) * 10 + 1, 100),
)

BARRIER_STEM = "barrier"
EventKey = tuple[str, int]  # (job id, seq): stream ids repeat across shards
_names = itertools.count(1)


# --- workers on the documented defaults ------------------------------------------------------


def default_worker_env(streams_url: str, pubsub_url: str, name: str) -> dict[str, str]:
    """The environment of a worker left on every documented default setting.

    Only what a test run cannot share with a production pod differs: the two servers
    (throwaway redis-servers), the ops HTTP address (loopback, a free port) and the consumer
    name (POD_NAME's role). Group, channel prefix, read count and block, lease TTL and renew,
    reclaim and stats intervals all keep their defaults; no `EVENT_ROUTER_*` variable of the
    calling environment leaks in. The families are the default's scan one alone: the load is
    scan jobs, and the default chat family's shards would only spread the leases over shards
    that hold nothing (a worker killed there would hold no entry to take over).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVENT_ROUTER_", "REDIS_")) and k != "POD_NAME"
    }
    env.update(
        REDIS_STREAMS_URL=streams_url,
        REDIS_PUBSUB_URL=pubsub_url,
        EVENT_ROUTER_CONSUMER_NAME=name,
        EVENT_ROUTER_HTTP_HOST="127.0.0.1",
        EVENT_ROUTER_HTTP_PORT="0",
        EVENT_ROUTER_STREAMS="scan:events=4",
    )
    return env


class DefaultWorkers:
    """Starts `eco-router worker` processes on the default settings; kills the rest at the end."""

    def __init__(self, log_dir: Path, *, streams_url: str, pubsub_url: str) -> None:
        self._log_dir = log_dir
        self._streams_url = streams_url
        self._pubsub_url = pubsub_url
        self.started: list[WorkerProcess] = []

    def spawn(self, name: str | None = None) -> WorkerProcess:
        name = name or f"router-{next(_names)}"
        env = default_worker_env(self._streams_url, self._pubsub_url, name)
        worker = WorkerProcess.spawn(env, self._log_dir / f"{name}.log")
        self.started.append(worker)
        return worker

    async def start(self, count: int) -> list[WorkerProcess]:
        """`count` workers started side by side, once each has logged its HTTP address."""
        workers = [self.spawn() for _ in range(count)]
        await asyncio.gather(*(w.until_ready() for w in workers))
        return workers

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.started if w.exit_code is None]

    def kill_all(self) -> None:
        for worker in self.started:
            with contextlib.suppress(ProcessLookupError):
                worker.ensure_dead()

    def logs(self) -> str:
        return "\n".join(w.log_tail(60) for w in self.started)


def pause(worker: WorkerProcess) -> None:
    """SIGSTOP: the process keeps its sockets and state and runs no code (a long GC pause,
    a frozen VM, a throttled container)."""
    os.kill(worker.process.pid, signal.SIGSTOP)


def resume(worker: WorkerProcess) -> None:
    os.kill(worker.process.pid, signal.SIGCONT)


async def stale_count(worker: WorkerProcess) -> float:
    return await worker.metric("event_router_events_total", verdict="stale")


# --- leases ----------------------------------------------------------------------------------


def lease_key(stream: str) -> str:
    """The lease hash of a shard, as operators find it: `eco-router:{group}:lease:{stream}`."""
    return f"eco-router:{GROUP}:lease:{{{stream}}}"


async def lease_owners(redis: Redis) -> dict[str, str]:
    """Stream → the router named by its live lease (shards nobody holds are left out)."""
    owners: dict[str, str] = {}
    for stream in SCAN.streams:
        owner = await redis.hget(lease_key(stream), "owner")  # type: ignore[misc]
        if owner is not None:
            owners[stream] = owner.decode()
    return owners


async def leases_spread(redis: Redis, workers: Sequence[WorkerProcess]) -> dict[str, str] | None:
    """The owners once every shard is held by one of `workers`, as evenly as they can share
    them (each ⌊shards/workers⌋ or one more); None before that."""
    owners = await lease_owners(redis)
    names = {w.name for w in workers}
    if len(owners) != SCAN.shards or not set(owners.values()) <= names:
        return None
    load = Counter({name: 0 for name in names})
    load.update(owners.values())
    low = SCAN.shards // len(names)
    return owners if all(low <= n <= low + 1 for n in load.values()) else None


async def busiest_first(
    redis: Redis, pair: Sequence[WorkerProcess]
) -> tuple[WorkerProcess, WorkerProcess]:
    """The worker holding the most shards now, then the other one.

    Of two workers started side by side one takes every shard and hands half over only when
    the other joins, a second or two later: on a backlog it is the one that surely still
    holds entries to route.
    """
    owners = await eventually(lambda: lease_owners(redis), what="a shard held")
    load = Counter(owners.values())
    first, second = pair
    return (first, second) if load[first.name] >= load[second.name] else (second, first)


async def held_by(redis: Redis, name: str, shards: int) -> bool:
    owners = await lease_owners(redis)
    return Counter(owners.values())[name] == shards


# --- what a worker holds ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeldEntry:
    """An entry pending at one consumer; `applied` when the state store names it as the entry
    that applied its (job, seq)."""

    stream: str
    entry_id: str
    job_id: str
    seq: int
    applied: bool

    @property
    def key(self) -> EventKey:
        return (self.job_id, self.seq)


async def entries_held_by(redis: Redis, consumer: str) -> list[HeldEntry]:
    """Every scan entry pending at `consumer` (XPENDING), with its job, seq and whether it
    was applied already."""
    async with redis.pipeline(transaction=False) as pipe:
        for stream in SCAN.streams:
            pipe.xpending_range(stream, GROUP, "-", "+", 100_000, consumername=consumer)
        pending = await pipe.execute()
    ids = [
        (s, row["message_id"].decode())
        for s, rows in zip(SCAN.streams, pending, strict=True)
        for row in rows
    ]
    async with redis.pipeline(transaction=False) as pipe:
        for stream, entry_id in ids:
            pipe.xrange(stream, min=entry_id, max=entry_id)
        found = await pipe.execute()
    entries = [
        (stream, entry_id, rows[0][1][b"job_id"].decode(), int(rows[0][1][b"seq"]))
        for (stream, entry_id), rows in zip(ids, found, strict=True)
        if rows
    ]
    async with redis.pipeline(transaction=False) as pipe:
        for _, _, job_id, seq in entries:
            pipe.hget(f"{SCAN.domain}:applied:{job_id}", str(seq))
        applied_by = await pipe.execute()
    return [
        # A marker is "<entry id> <the fields it was published with>".
        HeldEntry(
            stream, entry_id, job_id, seq, by is not None and by.split(b" ")[0] == entry_id.encode()
        )
        for (stream, entry_id, job_id, seq), by in zip(entries, applied_by, strict=True)
    ]


class Moment(Enum):
    """What a paused worker must hold for the pause to count (see `pause_while_holding`)."""

    UNPUBLISHED = "entries none of which is published"
    UNAPPLIED = "entries none of which is applied or published"
    APPLIED_UNPUBLISHED = "entries applied and not yet published"


def _missed(held: Sequence[HeldEntry], collector: TimedCollector, moment: Moment) -> str | None:
    """Why this pause does not count for `moment` (None: it does)."""
    if not held:
        return "nothing held"
    published = any(h.key in collector.first_arrival for h in held)
    applied = any(h.applied for h in held)
    if moment is Moment.APPLIED_UNPUBLISHED:
        late = [h for h in held if h.applied and h.key not in collector.first_arrival]
        return None if late else "none applied and unpublished"
    if published:
        return "some published"
    if moment is Moment.UNAPPLIED and applied:
        return "some applied"
    return None


async def pause_while_holding(
    worker: WorkerProcess,
    streams_redis: Redis,
    collector: TimedCollector,
    rng: random.Random,
    moment: Moment,
    *,
    attempts: int = 150,
) -> tuple[list[HeldEntry], int]:
    """SIGSTOP `worker` at a moment it holds entries as `moment` says; returns what it holds
    (XPENDING at its consumer) and how many pauses it took.

    A pause at another moment is undone and tried again a little later; each lasts a fraction
    of a second, far below the lease TTL. Why the moments matter:
    - `UNPUBLISHED` (before a kill): an entry already published but not acked is published
      again by the new holder: at least once, by design, and not what a test of order measures.
    - `UNAPPLIED` (before a long pause): a worker woken after losing its shards still publishes
      what it applied before the pause (the publish is not fenced), see `APPLIED_UNPUBLISHED`.
    """
    missed: Counter[str] = Counter()
    for attempt in range(1, attempts + 1):
        await asyncio.sleep(rng.uniform(0.01, 0.12))
        pause(worker)
        # What the worker sent before the pause has reached the servers and the subscriber.
        await asyncio.sleep(0.05)
        await collector.barrier()
        held = await entries_held_by(streams_redis, worker.name)
        reason = _missed(held, collector, moment)
        if reason is None:
            return held, attempt
        missed[reason] += 1
        resume(worker)
    raise AssertionError(f"{worker.name} never paused holding {moment.value}: {missed}")


# --- Pub/Sub, timed --------------------------------------------------------------------------


class TimedCollector(PubSubCollector):
    """Every message on `sse:events:*` with the time it arrived; barriers to wait for a flush."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.first_arrival: dict[EventKey, float] = {}  # (job, seq) → monotonic time
        self._barriers = itertools.count(1)
        self._passed: set[str] = set()

    async def barrier(self, timeout_s: float = 10.0) -> None:
        """Publish a marker and wait for it: everything the server published before it is in."""
        job = f"{BARRIER_STEM}-{next(self._barriers)}"
        client = Redis.from_url(self._url)
        try:
            await client.publish(f"{CHANNEL_PREFIX}:{job}", orjson.dumps({"job_id": job}))
        finally:
            await client.aclose()
        await eventually(lambda: job in self._passed, timeout_s=timeout_s, what=f"{job} back")

    def published(self, held: Iterable[HeldEntry]) -> bool:
        return all(h.key in self.first_arrival for h in held)

    def last_arrival(self, held: Iterable[HeldEntry]) -> float:
        """When the last of `held` was first received."""
        return max(self.first_arrival[h.key] for h in held)

    def events(self) -> list[dict[str, Any]]:
        """Every routed event received, in arrival order (barriers left out)."""
        return [m.payload for m in self.messages if "seq" in m.payload]

    def event_count(self) -> int:
        return len(self.messages) - len(self._passed)

    def _keep(self, message: dict[str, Any]) -> None:
        before = len(self.messages)
        super()._keep(message)
        if len(self.messages) == before:
            return
        payload = self.messages[-1].payload
        if "seq" not in payload:
            self._passed.add(payload["job_id"])
            return
        key = (str(payload["job_id"]), int(payload["seq"]))
        self.first_arrival.setdefault(key, time.monotonic())


# --- the load --------------------------------------------------------------------------------


class PacedLoad:
    """`lanes` jobs side by side through the producer SDK, as pipeline workers write them.

    Each job writes its steps one after another, a random 50-200 ms apart; when a job ends
    its lane starts the next one, until `stop`. A job's events are written only after the
    previous one was added, so its stream order is its seq order, and no event is ever late:
    a correct router publishes every one of them, in that order, and judges none stale.
    """

    def __init__(
        self,
        url: str,
        *,
        lanes: int,
        stem: str,
        seed: int,
        pace_s: tuple[float, float] = (0.05, 0.2),
    ) -> None:
        self._redis = Redis.from_url(url)
        self._publisher = AsyncStreamPublisher(
            self._redis, producer_config(domain=SCAN.domain, shards=SCAN.shards)
        )
        self._lanes = lanes
        self._stem = stem
        self._rng = random.Random(seed)
        self._pace_s = pace_s
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.written: dict[str, list[int]] = {}

    async def __aenter__(self) -> PacedLoad:
        self._tasks = [
            asyncio.create_task(self._lane(n), name=f"lane-{n}") for n in range(self._lanes)
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()

    async def stop(self) -> None:
        """Stop every lane after its current event; a lane's error surfaces here."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def run_for(self, seconds: float) -> None:
        """Let the load run `seconds` more; a lane that failed ends the wait early."""
        done, _ = await asyncio.wait(self._tasks, timeout=seconds)
        for task in done:
            task.result()

    async def _lane(self, lane: int) -> None:
        for number in itertools.count():
            job = f"{self._stem}-{lane:03d}-{number:04d}"
            seqs = self.written.setdefault(job, [])
            for stage, status, seq, progress in STEPS:
                if self._stop.is_set():
                    return
                await self._publisher.publish_stage_event(job, stage, status, progress=progress)
                seqs.append(seq)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._rng.uniform(*self._pace_s)):
                        await self._stop.wait()


async def fill_backlog(redis: Redis, *, jobs: int, stem: str) -> dict[str, list[int]]:
    """`jobs` times `STEPS` entries written as fast as pipelines go, steps interleaved across jobs
    as concurrent pipelines write them (no MAXLEN: nothing is trimmed)."""
    names = [f"{stem}-{n:05d}" for n in range(jobs)]
    streams = [SCAN.stream_for(job) for job in names]
    written: dict[str, list[int]] = {job: [] for job in names}
    commands = (
        (step, job, stream) for step in STEPS for job, stream in zip(names, streams, strict=True)
    )
    for chunk in _chunks(commands, 5_000):
        async with redis.pipeline(transaction=False) as pipe:
            for (stage, status, seq, progress), job, stream in chunk:
                entry = {
                    "job_id": job,
                    "stage": stage,
                    "status": status,
                    "seq": str(seq),
                    "ts": f"{time.time():.3f}",
                    "progress": str(progress),
                }
                pipe.xadd(stream, entry)  # type: ignore[arg-type]
                written[job].append(seq)
            await pipe.execute()
    return written


def _chunks(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# --- the checks every scenario ends with -----------------------------------------------------


def delivery_problems(
    written: Mapping[str, Sequence[int]], events: Iterable[Mapping[str, Any]]
) -> list[str]:
    """How the published events differ from what was written, job by job.

    Each job must be published exactly as written: every seq, once, in increasing order.
    """
    got: defaultdict[str, list[int]] = defaultdict(list)
    for event in events:
        got[str(event["job_id"])].append(int(event["seq"]))
    problems = [
        f"{job}: published {got[job]}, written {list(seqs)}"
        for job, seqs in written.items()
        if got[job] != list(seqs)
    ]
    problems += [
        f"{job}: published {seqs}, never written" for job, seqs in got.items() if job not in written
    ]
    return problems


@dataclass(slots=True)
class Ending:
    """What the end of a scenario found, for its figures."""

    events: int = 0
    jobs: int = 0
    stale: float = 0.0
    exits: dict[str, int] = field(default_factory=dict)


async def settle_and_check(
    *,
    written: Mapping[str, Sequence[int]],
    collector: TimedCollector,
    streams_redis: Redis,
    workers: DefaultWorkers,
    stale_seen: float,
    timeout_s: float = 30.0,
    as_the_gateway_sends: bool = False,
) -> Ending:
    """Wait for everything written to be published, then check the whole run.

    - Every job published exactly as written (all seqs, once each, in order), seen on one
      unbroken subscription (a reconnect could hide a message). `as_the_gateway_sends`
      judges what an SSE client gets instead: a seq at or below one already sent is dropped.
    - Nothing pending in the group, before the workers stop and after.
    - No STALE verdict: `stale_seen` (read from workers before they were killed or stopped)
      plus what the live workers count now. The producer never writes a late event, so any
      stale verdict comes from reordering (and would also show as a missing seq above).
    - Every live worker exits 0 on SIGTERM; no log holds an error or a traceback.
    """
    ending = Ending(events=sum(len(s) for s in written.values()), jobs=len(written))
    try:
        await eventually(
            lambda: collector.event_count() >= ending.events,
            timeout_s=timeout_s,
            every_s=0.1,
            what=f"{ending.events} events published",
        )
        await eventually(
            lambda: _pending_is_zero(streams_redis), timeout_s=10.0, what="nothing pending"
        )
        live = workers.live()
        ending.stale = stale_seen + sum([await stale_count(w) for w in live])
        for worker in live:
            worker.terminate()
        for worker in live:
            ending.exits[worker.name] = await worker.wait_exit()
        await collector.barrier()
    except AssertionError as error:
        problems = delivery_problems(written, collector.events())
        raise AssertionError(
            f"{error}\n{len(problems)} jobs differ, e.g. {problems[:5]}\n{workers.logs()}"
        ) from None

    events = collector.events()
    problems = delivery_problems(written, gateway_view(events) if as_the_gateway_sends else events)
    assert not problems, f"{len(problems)} of {len(written)} jobs differ: {problems[:5]}"
    assert collector.subscriptions == 1
    assert await pending_count(streams_redis, SCAN.streams) == 0
    assert ending.stale == 0
    assert set(ending.exits.values()) <= {0}, ending.exits
    for worker in workers.started:
        log = worker.log()
        assert " ERROR " not in log, worker.log_tail()
        assert "Traceback" not in log, worker.log_tail()
    return ending


def gateway_view(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events an SSE client gets: per job, each seq only if above the last one sent."""
    last: dict[str, int] = {}
    sent = []
    for event in events:
        job, seq = event["job_id"], int(event["seq"])
        if seq > last.get(job, -1):
            last[job] = seq
            sent.append(event)
    return sent


async def _pending_is_zero(redis: Redis) -> bool:
    return await pending_count(redis, SCAN.streams) == 0
