"""The rig of the fault scenarios: router processes, a closed-loop producer, SSE viewers, figures.

Every check looks from the outside, as an operator would: what reached Pub/Sub, what the state
keys hold, what is pending in the group, what the dead-letter stream holds and what each SSE
client received through the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import itertools
import json
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from eco_router.adapters.dead_letter_format import read_dead_letter
from eco_router.domain.rejection import RejectReason
from eco_router.producer import AsyncStreamPublisher, producer_config
from tests.integration.sse_client import SseStream, open_sse
from tests.integration.support import (
    GROUP,
    SCAN,
    PubSubCollector,
    WorkerProcess,
    Workers,
    pending_by_consumer,
    pending_count,
)
from tests.integration.test_gateway import Gateway

RESULTS_DIR = Path(__file__).parent / "results"

# Reclaim within seconds: an entry idle for 1 s is taken over on the next pass, every 0.5 s.
QUICK_SETTINGS = {
    "EVENT_ROUTER_RECLAIM_MIN_IDLE_MS": "1000",
    "EVENT_ROUTER_RECLAIM_INTERVAL_S": "0.5",
    "EVENT_ROUTER_READ_BLOCK_MS": "200",
}

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


# --- the load --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much load a scenario drives: `jobs` side by side, each a chain of `events`."""

    name: str
    jobs: int
    events: int
    pace_s: float = 0.05
    malformed: float = 0.0
    duplicates: float = 0.0
    viewers: int = 4

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "name"} | {"size": self.name}


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
    }
    return {"token": token.encode(), **wrong[reason]}


# Every reason a producer's entry can be rejected for (max_deliveries is the router's own).
MALFORMED_REASONS = tuple(r for r in RejectReason if r is not RejectReason.MAX_DELIVERIES)


class Load:
    """A producer driving `sizes.jobs` jobs at once, each publishing its next event only once
    the previous one is applied (the job's state reached its seq).

    Pipelines emit a job's stages one after the other; waiting for each to be applied also means
    no event can reach the router after a later event of its job, so a correct router must
    publish every one of them (none may be judged stale). Malformed entries and duplicates (a
    retry outside the producer's idempotency window) are mixed in at the configured shares.
    """

    def __init__(self, url: str, sizes: Sizes, *, stem: str, seed: int = 7) -> None:
        self.sizes = sizes
        self._redis = Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        self._publisher = AsyncStreamPublisher(self._redis, producer_config(domain="scan"))
        self._write_once = self._redis.register_script(_WRITE_ONCE)
        self._rng = random.Random(seed)
        self.jobs = [f"{stem}-{n:03d}" for n in range(sizes.jobs)]
        self.sent: set[EntryKey] = set()
        self.events: dict[EventKey, EntryKey] = {}
        self.abandoned: set[EventKey] = set()
        self.malformed: dict[EntryKey, str] = {}
        self.applied: dict[str, int] = {}
        self._tokens = itertools.count(1)
        self._stem = stem
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._watch: asyncio.Task[None] | None = None
        self._bad_slots = self._plan_malformed()
        self.errors: list[str] = []

    # -- what was written --

    @property
    def expected(self) -> set[EventKey]:
        """Distinct valid (job, seq) written and not lost on purpose: all must be published."""
        return set(self.events) - self.abandoned

    def highest(self) -> dict[str, int]:
        """Each job's highest expected seq: where its state must end."""
        top: dict[str, int] = {}
        for job, seq in self.expected:
            top[job] = max(seq, top.get(job, -1))
        return top

    def applied_keys(self) -> set[EventKey]:
        """The expected events the state store has applied (a job's state reached their seq)."""
        applied = {(job, seq) for job, top in self.applied.items() for seq in range(1, top + 1)}
        return applied & self.expected

    @property
    def routed(self) -> int:
        return sum(self.applied.values())

    @property
    def total_events(self) -> int:
        return self.sizes.jobs * self.sizes.events

    # -- running --

    def start(self) -> None:
        self._watch = asyncio.create_task(self._watch_states(), name="load-watch")
        self._tasks = [
            asyncio.create_task(self._job(job, random.Random(self._rng.random())), name=job)
            for job in self.jobs
        ]

    def abandon(self, keys: Iterable[EventKey]) -> None:
        """Events a scenario destroyed before any router could read them: not owed to anyone."""
        self.abandoned.update(keys)
        self._changed.set()

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
        for task in [*self._tasks, self._watch]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)
        await self._redis.aclose()

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

    async def _job(self, job: str, rng: random.Random) -> None:
        last = self.sizes.events
        for seq in range(1, last + 1):
            for reason in self._bad_slots.get((job, seq), []):
                await self._write_malformed(job, reason)
            stage, status = ("done", "done") if seq == last else (f"stage-{seq}", "completed")
            publish = functools.partial(
                self._publisher.publish_stage_event,
                job,
                stage,
                status,
                seq=seq,
                progress=min(100, seq * 100 // last),
            )
            entry_id = await self._retry(publish)
            stream = SCAN.stream_for(job)
            self.events[(job, seq)] = (stream, entry_id)
            self.sent.add((stream, entry_id))
            if rng.random() < self.sizes.duplicates:
                await self._write_duplicate(job, seq, stage, status)
            await self._until_applied(job, seq)
            await asyncio.sleep(self.sizes.pace_s * rng.uniform(0.5, 1.5))

    async def _until_applied(self, job: str, seq: int) -> None:
        while self.applied.get(job, -1) < seq and (job, seq) not in self.abandoned:
            self._changed.clear()
            await self._changed.wait()

    async def _watch_states(self) -> None:
        """One MGET of every job's state at a time, waking the jobs whose event was applied."""
        keys = [f"scan:state:{job}" for job in self.jobs]
        while True:
            try:
                states = await self._redis.mget(keys)
            except (RedisError, OSError):
                await asyncio.sleep(0.1)
                continue
            for job, raw in zip(self.jobs, states, strict=True):
                if raw is not None:
                    self.applied[job] = int(orjson.loads(raw)["seq"])
            self._changed.set()
            await asyncio.sleep(0.02)

    async def _write_malformed(self, job: str, reason: RejectReason) -> None:
        token = f"{self._stem}-bad-{next(self._tokens)}"
        stream = SCAN.stream_for(job)
        entry_id = await self._write_raw(stream, token, bad_entry(reason, job, token))
        self.malformed[(stream, entry_id)] = reason.value
        self.sent.add((stream, entry_id))

    async def _write_duplicate(self, job: str, seq: int, stage: str, status: str) -> None:
        token = f"{self._stem}-dup-{next(self._tokens)}"
        fields = {
            "job_id": job.encode(),
            "seq": str(seq).encode(),
            "stage": stage.encode(),
            "status": status.encode(),
        }
        stream = SCAN.stream_for(job)
        self.sent.add((stream, await self._write_raw(stream, token, fields)))

    async def _write_raw(self, stream: str, token: str, fields: Mapping[str, bytes]) -> str:
        args: list[str | bytes] = []
        for name, value in fields.items():
            args += (name, value)
        marker = f"faults:once:{token}"
        return await self._retry(lambda: self._write_once(keys=[stream, marker], args=args))

    async def _retry(self, call: Callable[[], Awaitable[Any]], timeout_s: float = 60.0) -> str:
        """Call until the server answers (it may be down or unreachable for a while)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = await call()
            except (RedisError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            return reply.decode() if isinstance(reply, bytes) else str(reply)


# --- SSE viewers -----------------------------------------------------------------------------


class Viewer:
    """A browser tab watching one job through the gateway.

    When the stream drops it reconnects with the last id it got as Last-Event-ID, as
    EventSource does, until it receives the job's terminal event (or is cancelled).
    """

    def __init__(self, base_url: Callable[[], str], job_id: str) -> None:
        self._base_url = base_url
        self.job_id = job_id
        self.seqs: list[int] = []
        self.connections = 0
        self.finished = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"viewer-{self.job_id}")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

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
        # Keepalives come every second: five silent seconds mean a dead connection.
        timeout = httpx.Timeout(5.0)
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
    """One scenario's result file (`tests/faults/results/<scenario>.json`)."""

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
    passed: bool = False

    def write(self) -> Path:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.scenario}.json"
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=False) + "\n")
        return path


@dataclass(slots=True)
class Findings:
    """What the final checks found, beyond the figures; empty lists mean the invariant holds."""

    lost: list[EventKey] = field(default_factory=list)
    unexpected: list[EventKey] = field(default_factory=list)
    wrong_states: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    pending: int = 0
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


# --- the rig ---------------------------------------------------------------------------------


class FaultRig:
    """Router processes (workers and one gateway) on a pair of servers, plus the observers.

    `router_streams_url` / `router_pubsub_url` are what the routers dial (a relay in some
    scenarios); the producer, the collector and the checks always reach the servers directly.
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
    ) -> None:
        self.log_dir = log_dir
        self.sizes = scenario.sizes
        self.streams_url = streams_url
        self.pubsub_url = pubsub_url
        self.router_streams_url = router_streams_url or streams_url
        self.router_pubsub_url = router_pubsub_url or pubsub_url
        self.workers = Workers(
            log_dir, streams_url=self.router_streams_url, pubsub_url=self.router_pubsub_url
        )
        self.gateways: list[Gateway] = []
        self._settings: dict[str, str] = dict(QUICK_SETTINGS)
        self.collector = PubSubCollector(pubsub_url)
        self.redis = Redis.from_url(streams_url, socket_timeout=5.0, socket_connect_timeout=1.0)
        self.load = Load(streams_url, scenario.sizes, stem=f"{scenario.number:02d}-job")
        self.viewers: list[Viewer] = []
        self.figures = Figures(
            scenario=scenario.name, title=scenario.title, params=scenario.sizes.params()
        )
        self.findings = Findings()
        self._recovery: asyncio.Task[None] | None = None
        self._recovered = False
        # Consumers of the group besides the routers this rig started (a scenario's own).
        self.known_consumers: set[str] = set()
        self._collecting = False

    # -- set-up --

    async def start(self, *, workers: int = 2, **env: str) -> list[WorkerProcess]:
        """The collector, `workers` workers and the gateway; returns the workers once ready."""
        await self.collector.__aenter__()
        self._collecting = True
        self._settings |= env
        started = [self.workers.spawn(**self._settings) for _ in range(workers)]
        await self.start_gateway()
        await asyncio.gather(*(w.until_ready() for w in started))
        return started

    async def start_worker(self) -> WorkerProcess:
        return await self.workers.start(**self._settings)

    async def start_gateway(self) -> Gateway:
        """A gateway that takes over the address viewers (re)connect to, as behind a balancer."""
        gateway = await asyncio.to_thread(
            Gateway.launch,
            self.log_dir,
            streams_url=self.router_streams_url,
            pubsub_url=self.router_pubsub_url,
            **self._settings,
        )
        self.gateways.append(gateway)
        return gateway

    @property
    def gateway(self) -> Gateway:
        """The gateway new connections go to (the latest started)."""
        assert self.gateways, "no gateway started"
        return self.gateways[-1]

    def start_load(self) -> None:
        """Viewers on the first jobs first (so they see each job whole), then the load."""
        for job in self.load.jobs[: self.sizes.viewers]:
            viewer = Viewer(lambda: self.gateway.base_url, job)
            viewer.start()
            self.viewers.append(viewer)
        self.load.start()

    @property
    def routers(self) -> list[WorkerProcess]:
        """Every router process still running (workers and the gateway)."""
        everyone = [*self.workers.started, *self.gateways]
        return [p for p in everyone if p.exit_code is None]

    async def metric_sum(self, sample: str, **labels: str) -> float:
        """A metric summed over every running router."""
        values = await asyncio.gather(*(p.metric(sample, **labels) for p in self.routers))
        return sum(values)

    async def pending_of(self, consumer: str) -> int:
        return (await pending_by_consumer(self.redis)).get(consumer, 0)

    # -- the fault's end and the recovery --

    def fault_over(self, also: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Start the recovery clock.

        Recovered means: every event written so far is published, every malformed entry
        written so far is dead-lettered, and the scenario's own condition (`also`) holds.
        """
        ended = time.monotonic()
        owed = set(self.load.expected)
        malformed = set(self.load.malformed)

        async def holds() -> bool:
            if not owed - self.load.abandoned <= self.collector.received_keys():
                return False
            if not {key for key, _ in await self.dead_letters()} >= malformed:
                return False
            return also is None or await also()

        async def clock() -> None:
            if await until(holds, timeout_s=120):
                self.figures.recovery_s = round(time.monotonic() - ended, 3)
                self._recovered = True

        self._recovery = asyncio.create_task(clock(), name="recovery-clock")

    # -- the end --

    async def settle(self, *, timeout_s: float = 60.0) -> Figures:
        """Let the load finish and the system drain, then take the figures and the findings."""
        findings = self.findings
        if not await self.load.finish(timeout_s):
            findings.load_errors = self.load.errors or [
                f"load unfinished: {self.load.routed}/{self.load.total_events} events applied"
            ]
        expected = self.load.expected
        await until(lambda: expected <= self.collector.received_keys(), timeout_s=20)
        await until(self._nothing_pending, timeout_s=20)
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

        published = self.collector.received_keys()
        findings.lost = sorted(expected - published)
        findings.unexpected = sorted(published - expected)
        findings.pending = await pending_count(self.redis)
        foreign = await self._consumers() - self._our_consumers()
        if foreign:
            findings.extra.append(f"consumers this test did not start joined: {foreign}")
        if findings.pending:
            findings.extra.append(f"still pending: {await self._pending_details()}")
        await self._check_states(highest)
        await self._checkdead_letters()
        for viewer in self.viewers:
            if viewer.duplicates:
                findings.viewer_duplicates[viewer.job_id] = viewer.seqs
            if not viewer.in_order:
                findings.viewers_out_of_order[viewer.job_id] = viewer.seqs
            if not viewer.reached(highest.get(viewer.job_id, 0)):
                findings.viewers_behind[viewer.job_id] = viewer.seqs

        figures = self.figures
        figures.params |= {
            "sse_clients": len(self.viewers),
            "sse_events_received": sum(len(v.seqs) for v in self.viewers),
            "sse_reconnects": sum(v.connections - 1 for v in self.viewers),
        }
        figures.sent = len(self.load.sent)
        figures.expected = len(expected)
        figures.published = len(published & expected)
        figures.lost = len(findings.lost)
        figures.duplicated_to_clients = sum(v.duplicates for v in self.viewers)
        figures.dead_lettered = len(await self.dead_letters())
        return figures

    def require(self, condition: bool, what: str) -> None:
        """A scenario's own check, recorded with the invariants (and failing the test with them)."""
        if not condition:
            self.findings.extra.append(what)

    def conclude(self) -> None:
        """Write the result file, then assert the three invariants and the scenario's checks."""
        findings, figures = self.findings, self.figures
        figures.passed = findings.ok
        figures.write()
        logs = "\n".join(p.log_tail(15) for p in [*self.workers.started, *self.gateways])
        assert not findings.load_errors, (findings.load_errors, logs)
        # Nothing lost.
        assert figures.lost == 0, (findings.lost[:20], logs)
        assert not findings.unexpected, findings.unexpected[:20]
        assert not findings.wrong_states, findings.wrong_states
        # No duplicate reaches a client.
        assert figures.duplicated_to_clients == 0, findings.viewer_duplicates
        assert not findings.viewers_out_of_order, findings.viewers_out_of_order
        assert not findings.viewers_behind, findings.viewers_behind
        # Nothing stranded.
        assert findings.pending == 0, logs
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
        self.workers.kill_all()
        for gateway in self.gateways:
            await asyncio.to_thread(gateway.stop)
        await self.redis.aclose()

    # -- internals --

    def _our_consumers(self) -> set[str]:
        routers = [*self.workers.started, *self.gateways]
        return {p.name for p in routers} | self.known_consumers

    async def _consumers(self) -> set[str]:
        """Every consumer of the group, on every shard."""
        names = set()
        for stream in SCAN.streams:
            for consumer in await self.redis.xinfo_consumers(stream, GROUP):
                names.add(consumer["name"].decode())
        return names

    async def _pending_details(self) -> list[tuple[str, str, str, int, dict[bytes, bytes]]]:
        """(stream, id, consumer, deliveries, fields) of every pending entry, for the report."""
        details = []
        for stream in SCAN.streams:
            for item in await self.redis.xpending_range(stream, GROUP, "-", "+", 100):
                entry_id = item["message_id"].decode()
                found = await self.redis.xrange(stream, entry_id, entry_id)
                fields = found[0][1] if found else {}
                consumer = item["consumer"].decode()
                details.append((stream, entry_id, consumer, item["times_delivered"], fields))
        return details

    async def _nothing_pending(self) -> bool:
        return await pending_count(self.redis) == 0

    async def dead_letters(self) -> list[tuple[EntryKey, str]]:
        raw = await self.redis.xrange(SCAN.dead_letter_stream)
        letters = [read_dead_letter(i.decode(), fields) for i, fields in raw]
        return [((d.stream, d.entry_id), d.reason) for d in letters]

    async def _dead_letters_complete(self) -> bool:
        return {key for key, _ in await self.dead_letters()} >= set(self.load.malformed)

    async def _check_states(self, highest: Mapping[str, int]) -> None:
        jobs = sorted(highest)
        raw = await self.redis.mget([f"scan:state:{job}" for job in jobs]) if jobs else []
        for job, value in zip(jobs, raw, strict=True):
            seq = None if value is None else int(orjson.loads(value)["seq"])
            if seq != highest[job]:
                self.findings.wrong_states[job] = (highest[job], seq)

    async def _checkdead_letters(self) -> None:
        letters = await self.dead_letters()
        held = {key for key, _ in letters}
        malformed = self.load.malformed
        self.findings.dead_letters_missing = sorted(set(malformed) - held)
        self.findings.dead_letters_extra = sorted(held - set(malformed))
        for key, reason in letters:
            if key in malformed and malformed[key] != reason:
                self.findings.wrong_reasons[key] = (malformed[key], reason)
