"""Router benchmark: throughput, Redis CPU per event and end-to-end latency of `eco-router worker`.

Run from the repository root: `.venv/bin/python -m bench.router_bench` (or `make bench`).

Every phase gets freshly started throwaway redis-server processes (one for streams, one for
Pub/Sub) and a fresh router subprocess, so phases do not see each other's data or state keys.

- Throughput: the four `scan:events` shards are pre-filled (pipelined XADD) with a realistic mix,
  including retried duplicates and late (out-of-order) events, then a router drains them.
- Latency: a separate producer process XADDs at a paced rate while this process, psubscribed to
  `sse:events:*`, timestamps every published payload; latency = receive time - entry id time.
- Baseline: the same with `bench/one_at_a_time.py`, a naive router that reads, applies, publishes
  and acks one event at a time, on a smaller fill and a bounded paced run; and, as a secondary
  figure, the worker itself with EVENT_ROUTER_READ_COUNT=1 (COUNT is per stream, so that still
  reads up to one entry per shard).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import select
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hiredis
import orjson
import redis

from bench.pacing import Pacer
from bench.producer_process import ProducerProcess
from bench.redis_servers import redis_servers
from bench.reporting import RESULTS_DIR, ms, percentile, run_benchmark, step
from bench.router_process import RouterProcess, eco_router_command, eco_router_env
from eco_router.domain.streams import StreamFamily, shard_for
from eco_router.testing import RedisServer

FAMILY = StreamFamily("scan:events", 4)
GROUP = "eventrouter"
CHANNEL_PATTERN = "sse:events:*"
RESULTS_PATH = RESULTS_DIR / "router.json"

BATCHED_READ_COUNT = 100
DUPLICATE_SHARE = 0.05
LATE_SHARE = 0.03
FILL_PIPELINE = 1_000
POLL_INTERVAL_S = 0.01
DRAIN_TIMEOUT_S = 120.0
WORKER_READY_TIMEOUT_S = 30.0
# The commands the apply scripts call; commandstats counts them inside EVALSHA's time too.
SCRIPT_COMMANDS = frozenset({"hmget", "hset", "rpush", "set", "ltrim", "expire"})
STAGES = ("fetch", "resolve", "scan", "analyze", "report")


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True, slots=True)
class Workload:
    """Entries in XADD order, and how many of them are retries and late arrivals."""

    entries: list[tuple[str, dict[str, str]]]
    jobs: int
    duplicates: int
    late: int


def make_workload(events: int, jobs: int, seed: int) -> Workload:
    """`events` entries for `jobs` jobs: queued, running, progress..., done (with result JSON).

    Jobs run concurrently (their events interleave at random, each job's own in seq order).
    ~5% of entries are retries (an entry added again, same job/seq/fields, a little later);
    ~3% are late: held back and added only after 1-3 newer events of the same job.
    """
    rng = random.Random(seed)
    duplicates = round(events * DUPLICATE_SHARE)
    base = events - duplicates
    if base < 3 * jobs:
        raise SystemExit(f"--events {events} is too few for --jobs {jobs} (3+ events per job)")
    job_ids = [f"scan-{i:06d}-{rng.getrandbits(32):08x}" for i in range(jobs)]
    per_job = [base // jobs + (1 if i < base % jobs else 0) for i in range(jobs)]
    streams = [stream_of(job_id) for job_id in job_ids]
    started_ms = int(time.time() * 1000) - 600_000

    # Jobs interleave at random; the key of each event is its place in the global order.
    order = [j for j, n in enumerate(per_job) for _ in range(n)]
    rng.shuffle(order)
    next_seq = [0] * jobs
    keyed: list[tuple[float, int, int]] = []  # (position, job, seq)
    position_of: dict[tuple[int, int], int] = {}
    for position, job in enumerate(order):
        keyed.append((float(position), job, next_seq[job]))
        position_of[(job, next_seq[job])] = position
        next_seq[job] += 1

    # Late: an event moves to just after the k-th newer event of its job (k = 1..3).
    late_candidates = [i for i, (_, job, seq) in enumerate(keyed) if seq < per_job[job] - 1]
    late_indices = rng.sample(
        late_candidates, min(len(late_candidates), round(events * LATE_SHARE))
    )
    for i in late_indices:
        _, job, seq = keyed[i]
        newer = min(seq + rng.randint(1, 3), per_job[job] - 1)
        keyed[i] = (position_of[(job, newer)] + 0.5, job, seq)

    # Retries: the same event again, 1-400 positions later (a producer retrying after a timeout).
    for i in rng.sample(range(len(keyed)), duplicates):
        at, job, seq = keyed[i]
        keyed.append((at + rng.randint(1, 400) + 0.25, job, seq))

    keyed.sort()
    entries = [
        (streams[job], _job_fields(job_ids[job], seq, per_job[job], started_ms, rng))
        for _, job, seq in keyed
    ]
    return Workload(entries, jobs, duplicates, len(late_indices))


def _job_fields(
    job_id: str, seq: int, count: int, started_ms: int, rng: random.Random
) -> dict[str, str]:
    """The fields of a job's `seq`-th of `count` events (deterministic apart from ts jitter)."""
    last = count - 1
    fields = {"job_id": job_id, "seq": str(seq), "ts": str(started_ms + seq * 250)}
    if seq == 0:
        fields.update(stage="queued", status="queued", progress="0")
    elif seq == last:
        findings = (seq * 7919 + len(job_id)) % 40
        result = {
            "findings": findings,
            "severity": {"high": findings // 8, "medium": findings // 3, "low": findings},
            "score": round(100 - findings * 1.7, 1),
            "report_url": f"https://reports.example.com/scan/{job_id}.html",
            "duration_ms": seq * 250 + rng.randint(0, 99),
        }
        fields.update(stage="done", status="done", progress="100", result=json.dumps(result))
    else:
        progress = seq * 100 // last
        fields.update(
            stage=STAGES[min(len(STAGES) - 1, progress * len(STAGES) // 100)],
            status="running",
            progress=str(progress),
            worker=f"scanner-{sum(job_id.encode()) % 8}",
        )
    return fields


def fill(client: redis.Redis, entries: Sequence[tuple[str, dict[str, str]]]) -> float:
    """XADD every entry in pipelines of FILL_PIPELINE; returns the seconds it took."""
    started = time.perf_counter()
    for start in range(0, len(entries), FILL_PIPELINE):
        pipe = client.pipeline(transaction=False)
        for stream, fields in entries[start : start + FILL_PIPELINE]:
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
        pipe.execute()
    return time.perf_counter() - started


# --------------------------------------------------------------------------- router processes


@dataclass(frozen=True, slots=True)
class RouterKind:
    """Which router a phase runs: `eco-router worker` at a READ_COUNT, or the naive baseline."""

    name: str
    read_count: int | None  # None: bench/one_at_a_time.py

    @property
    def reads(self) -> str:
        """What one XREADGROUP asks for."""
        if self.read_count is None:
            return "COUNT 1, 1 stream"
        return f"COUNT {self.read_count}, {FAMILY.shards} streams"

    def spawn(self, streams_url: str, pubsub_url: str, *, name: str) -> RouterProcess:
        if self.read_count is None:
            return NaiveRouter(streams_url, pubsub_url, name=name)
        return Worker(streams_url, pubsub_url, read_count=self.read_count, name=name)


BATCHED = RouterKind("batched", BATCHED_READ_COUNT)
READ_COUNT_1 = RouterKind("READ_COUNT=1", 1)
NAIVE = RouterKind("naive", None)


class Worker(RouterProcess):
    """`eco-router worker`; its figures come from its /metrics page just before it stops."""

    def __init__(self, streams_url: str, pubsub_url: str, *, read_count: int, name: str) -> None:
        env = eco_router_env(
            streams_url,
            pubsub_url,
            EVENT_ROUTER_STREAMS=f"{FAMILY.prefix}={FAMILY.shards}",
            EVENT_ROUTER_CONSUMER_GROUP=GROUP,
            EVENT_ROUTER_CONSUMER_NAME=name,
            EVENT_ROUTER_READ_COUNT=str(read_count),
            EVENT_ROUTER_HTTP_HOST="127.0.0.1",
            EVENT_ROUTER_HTTP_PORT="0",
            EVENT_ROUTER_LOG_LEVEL="WARNING",
        )
        super().__init__(eco_router_command("worker"), env=env, name=name)

    def http_url(self) -> str | None:
        port = self._http_port()
        return None if port is None else f"http://127.0.0.1:{port}"

    def metrics(self) -> dict[str, float]:
        """Verdict counts and batch sizes from the worker's /metrics, or {} if unreachable."""
        return self.router_figures()

    def _before_stop(self) -> None:
        self.figures = self.metrics()

    def _http_port(self) -> int | None:
        """The port the worker listens on (it was given port 0), from /proc socket inodes."""
        fd_dir = Path(f"/proc/{self.process.pid}/fd")
        inodes = set()
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:  # 0A = LISTEN
                    return int(parts[1].rpartition(":")[2], 16)
        return None


class NaiveRouter(RouterProcess):
    """`python -m bench.one_at_a_time`; its figures come from the summary line it prints on exit."""

    def __init__(self, streams_url: str, pubsub_url: str, *, name: str) -> None:
        command = [
            sys.executable,
            "-m",
            "bench.one_at_a_time",
            "--streams-url",
            streams_url,
            "--pubsub-url",
            pubsub_url,
            "--group",
            GROUP,
            "--consumer",
            name,
            "--prefix",
            FAMILY.prefix,
            "--shards",
            str(FAMILY.shards),
        ]
        super().__init__(command, env=dict(os.environ), name=name)

    def _after_stop(self) -> None:
        text = Path(self._log.name).read_text(errors="replace")
        summaries = [line for line in text.splitlines() if line.startswith("summary ")]
        if not summaries:
            return
        counts: dict[str, int] = orjson.loads(summaries[-1].removeprefix("summary "))
        self.figures = {name: float(value) for name, value in counts.items()}
        # One entry per read that found one: the same figures the worker's histogram gives.
        self.figures["batch_size_sum"] = float(
            sum(counts.get(v, 0) for v in ("new", "duplicate", "stale", "invalid"))
        )
        self.figures["batch_size_count"] = float(counts.get("reads", 0) - counts.get("empty", 0))


# --------------------------------------------------------------------------- Redis probes


def redis_cpu_seconds(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def command_usec(client: redis.Redis) -> dict[str, int]:
    """Server-side microseconds per command since the last CONFIG RESETSTAT."""
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["usec"]) for name, s in stats.items()}


@dataclass(slots=True)
class GroupState:
    """The consumer group on every shard: whether it exists, what it read, what is left."""

    exists: bool
    entries_read: int
    lag: int
    pending: int

    @property
    def drained(self) -> bool:
        return self.exists and self.lag == 0 and self.pending == 0


def group_state(client: redis.Redis) -> GroupState:
    pipe = client.pipeline(transaction=False)
    for stream in FAMILY.streams:
        pipe.xinfo_groups(stream)
    replies = pipe.execute(raise_on_error=False)
    state = GroupState(exists=True, entries_read=0, lag=0, pending=0)
    for reply in replies:
        group = None
        if isinstance(reply, list):
            group = next((g for g in reply if _text(g.get("name")) == GROUP), None)
        if group is None:
            state.exists = False
            continue
        state.entries_read += int(group.get("entries-read") or 0)
        state.pending += int(group.get("pending") or 0)
        lag = group.get("lag")
        # Redis reports no lag when it cannot tell; count that as not drained.
        state.lag += int(lag) if lag is not None else 1
    return state


def wait_for_groups(client: redis.Redis, router: RouterProcess) -> None:
    """Until the router has created its group on every shard (it reads right after)."""
    deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
    while not group_state(client).exists:
        router.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{router.name} created no groups in {WORKER_READY_TIMEOUT_S}s")
        time.sleep(POLL_INTERVAL_S)


def stream_of(job_id: str) -> str:
    """The shard a producer writes `job_id` to: the router's own md5 rule."""
    return f"{FAMILY.prefix}:{shard_for(job_id, FAMILY.shards)}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- throughput


@dataclass(slots=True)
class Throughput:
    """A drain of a pre-filled backlog."""

    router: str
    reads: str
    events: int
    jobs: int
    duplicates_added: int
    late_added: int
    fill_s: float
    drain_s: float
    wall_from_spawn_s: float
    events_per_s: float
    redis_cpu_us_per_event: float
    pubsub_cpu_us_per_event: float
    worker_cpu_us_per_event: float
    mean_batch_size: float | None
    verdicts: dict[str, int]
    redis_usec_per_event_by_command: dict[str, float]
    # Every repeat, in run order; the figures above are the run with the median events/s.
    runs_events_per_s: list[float] = field(default_factory=list)
    runs_redis_cpu_us_per_event: list[float] = field(default_factory=list)


def measure_throughput(
    streams: RedisServer,
    pubsub: RedisServer,
    *,
    kind: RouterKind,
    events: int,
    jobs: int,
    seed: int,
) -> Throughput:
    workload = make_workload(events, jobs, seed)
    client = redis.Redis.from_url(streams.url)
    pubsub_client = redis.Redis.from_url(pubsub.url)
    try:
        fill_s = fill(client, workload.entries)
        client.config_resetstat()
        cpu_before = redis_cpu_seconds(client)
        pubsub_cpu_before = redis_cpu_seconds(pubsub_client)
        name = f"bench-drain-{_slug(kind.name)}"
        with kind.spawn(streams.url, pubsub.url, name=name) as router:
            first_read_at, worker_cpu_at_first, drained_at = _watch_drain(client, router, events)
            worker_cpu = router.cpu_seconds() - worker_cpu_at_first
            cpu_after = redis_cpu_seconds(client)
            pubsub_cpu_seconds = redis_cpu_seconds(pubsub_client) - pubsub_cpu_before
            usec = command_usec(client)
            wall_from_spawn = drained_at - router.started
        metrics = router.figures  # collected as it stopped
    finally:
        client.close()
        pubsub_client.close()
    drain_s = drained_at - first_read_at
    batches = metrics.get("batch_size_count")
    return Throughput(
        router=kind.name,
        reads=kind.reads,
        events=events,
        jobs=jobs,
        duplicates_added=workload.duplicates,
        late_added=workload.late,
        fill_s=fill_s,
        drain_s=drain_s,
        wall_from_spawn_s=wall_from_spawn,
        events_per_s=events / drain_s,
        redis_cpu_us_per_event=(cpu_after - cpu_before) * 1e6 / events,
        pubsub_cpu_us_per_event=pubsub_cpu_seconds * 1e6 / events,
        worker_cpu_us_per_event=worker_cpu * 1e6 / events,
        mean_batch_size=metrics["batch_size_sum"] / batches if batches else None,
        verdicts={
            v: int(metrics[v]) for v in ("new", "duplicate", "stale", "invalid") if v in metrics
        },
        redis_usec_per_event_by_command={
            name: round(us / events, 2)
            for name, us in sorted(usec.items(), key=lambda item: -item[1])
            if name not in ("config|resetstat", "info")
        },
    )


def _watch_drain(
    client: redis.Redis, router: RouterProcess, events: int
) -> tuple[float, float, float]:
    """Poll XINFO GROUPS: (first read seen, worker CPU then, drained seen), monotonic times."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    first_read_at: float | None = None
    worker_cpu_at_first = 0.0
    while True:
        state = group_state(client)
        now = time.monotonic()
        if first_read_at is None and state.exists and (state.entries_read or state.pending):
            first_read_at, worker_cpu_at_first = now, router.cpu_seconds()
        if first_read_at is not None and state.drained:
            return first_read_at, worker_cpu_at_first, now
        router.check_alive()
        if now > deadline:
            raise RuntimeError(
                f"not drained after {DRAIN_TIMEOUT_S}s: lag {state.lag}, pending {state.pending} "
                f"of {events}"
            )
        time.sleep(POLL_INTERVAL_S)


# --------------------------------------------------------------------------- latency


def produce_paced(url: str, rate: int, seconds: float, jobs: int) -> tuple[int, float]:
    """Producer process: XADD `rate` events/s for `seconds`, a small pipeline every tick."""
    client = redis.Redis.from_url(url)
    job_ids = [f"live-{i:05d}" for i in range(jobs)]
    streams = [stream_of(job_id) for job_id in job_ids]
    seqs = [0] * jobs
    pacer = Pacer(rate, seconds)
    try:
        while not pacer.finished:
            if batch := pacer.due():
                pipe = client.pipeline(transaction=False)
                ts = str(int(time.time() * 1000))
                for n in batch:
                    job = n % jobs
                    seqs[job] += 1
                    pipe.xadd(
                        streams[job],
                        {
                            "job_id": job_ids[job],
                            "seq": seqs[job],
                            "stage": "scan",
                            "status": "running",
                            "progress": seqs[job] % 100,
                            "ts": ts,
                        },
                    )
                pipe.execute()
            time.sleep(pacer.pause_s())
        return pacer.sent, pacer.elapsed_s()
    finally:
        client.close()


class Subscriber:
    """A raw RESP connection psubscribed to the router's channels; timestamps each chunk read."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = hiredis.Reader()
        self._sock.sendall(
            b"*2\r\n$10\r\nPSUBSCRIBE\r\n$%d\r\n%b\r\n"
            % (len(CHANNEL_PATTERN), CHANNEL_PATTERN.encode())
        )
        self.received: list[tuple[float, bytes]] = []
        give_up = time.monotonic() + 10
        while not self.received and time.monotonic() < give_up:
            self.poll(0.1)
        if not self.received:
            raise RuntimeError("no reply to PSUBSCRIBE")
        confirmation = self.received.pop()
        if confirmation[1] != b"psubscribe":
            raise RuntimeError(f"unexpected reply to PSUBSCRIBE: {confirmation!r}")

    def receive_until(self, count: int, deadline: float) -> None:
        """Collect payloads until `count` arrived or time.monotonic() passes `deadline`."""
        while len(self.received) < count and time.monotonic() < deadline:
            self.poll(0.05)

    def poll(self, timeout: float) -> bool:
        """Read what arrived within `timeout`; False if nothing did."""
        readable, _, _ = select.select([self._sock], [], [], timeout)
        if not readable:
            return False
        chunk = self._sock.recv(1 << 20)
        received_at = time.time()
        if not chunk:
            raise ConnectionError("pub/sub connection closed")
        self._reader.feed(chunk)
        while (message := self._reader.gets()) is not False:
            if message[0] == b"pmessage":
                self.received.append((received_at, message[3]))
            else:
                self.received.append((received_at, message[0]))
        return True

    def close(self) -> None:
        self._sock.close()


@dataclass(slots=True)
class Latency:
    """Paced production with a subscriber timing every published payload."""

    router: str
    reads: str
    target_rate: int
    achieved_rate: float
    seconds: float
    sent: int
    received: int
    missing_at_deadline: int
    wait_after_producer_s: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    drained_after_producer_s: float | None
    # Over the payloads that arrived by the deadline only: what a saturated router delivered.
    arrived_p50_ms: float | None = None
    arrived_p99_ms: float | None = None
    note: str = ""


def measure_latency(
    streams: RedisServer,
    pubsub: RedisServer,
    *,
    kind: RouterKind,
    rate: int,
    seconds: float,
    jobs: int,
    wait_after_s: float,
) -> Latency:
    client = redis.Redis.from_url(streams.url)
    name = f"bench-live-{_slug(kind.name)}"
    try:
        with kind.spawn(streams.url, pubsub.url, name=name) as router:
            wait_for_groups(client, router)
            subscriber = Subscriber(pubsub.port)
            try:
                with ProducerProcess(
                    produce_paced, streams.url, rate, seconds, jobs, name="bench-producer"
                ) as producer:
                    sent, produce_s = producer.figures(
                        2 * seconds + 30, meanwhile=lambda: subscriber.poll(0.05)
                    )
                # The wait for stragglers starts when the producer ended, however late it ran.
                produced_at = time.monotonic()
                subscriber.receive_until(sent, produced_at + wait_after_s)
                drained_after = _drained_within(client, deadline=produced_at + wait_after_s)
            finally:
                subscriber.close()
    finally:
        client.close()

    latencies = sorted(
        received_at * 1000 - int(orjson.loads(payload)["stream_id"].partition("-")[0])
        for received_at, payload in subscriber.received
    )
    missing = max(0, sent - len(latencies))
    # Payloads not received by the deadline count as infinitely late, not as absent.
    ranked = latencies + [math.inf] * missing
    return Latency(
        router=kind.name,
        reads=kind.reads,
        target_rate=rate,
        achieved_rate=sent / produce_s,
        seconds=produce_s,
        sent=sent,
        received=len(latencies),
        missing_at_deadline=missing,
        wait_after_producer_s=wait_after_s,
        p50_ms=percentile(ranked, 50),
        p90_ms=percentile(ranked, 90),
        p99_ms=percentile(ranked, 99),
        max_ms=percentile(ranked, 100),
        drained_after_producer_s=(
            None if drained_after is None else round(drained_after - produced_at, 3)
        ),
        arrived_p50_ms=percentile(latencies, 50),
        arrived_p99_ms=percentile(latencies, 99),
    )


def _drained_within(client: redis.Redis, *, deadline: float) -> float | None:
    while True:
        if group_state(client).drained:
            return time.monotonic()
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL_INTERVAL_S)


def _slug(name: str) -> str:
    return name.lower().replace("=", "")


# --------------------------------------------------------------------------- orchestration


@dataclass(slots=True)
class Report:
    config: dict[str, Any]
    environment: dict[str, Any]
    batched_throughput: Throughput
    batched_latency: Latency
    naive_throughput: Throughput | None = None
    naive_latency: Latency | None = None
    read_count_1_throughput: Throughput | None = None
    read_count_1_latency: Latency | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)


DEFINITIONS = {
    "events_per_s": (
        "entries drained / (t_drained - t_first_read); t_first_read = first XINFO GROUPS poll "
        f"(every {POLL_INTERVAL_S * 1000:.0f} ms) showing entries-read or pending > 0, "
        "t_drained = first poll showing lag 0 and pending 0 on all 4 shards; router start-up "
        "(interpreter, imports, connections) is excluded and reported separately as wall_from_spawn"
    ),
    "redis_cpu_us_per_event": (
        "streams redis-server used_cpu_sys + used_cpu_user (INFO cpu) after the drain minus "
        "before the router started, per entry; includes the benchmark's own XINFO polling"
    ),
    "worker_cpu_us_per_event": "router process utime + stime (/proc) from t_first_read to drained",
    "latency": (
        "subscriber receive time (time.time() when the socket chunk was read) - the entry id's "
        "millisecond part (redis-server clock, same host); the id truncates to the millisecond, "
        "so figures read up to 1 ms high; payloads not received by the deadline rank as infinite "
        "in p50..max, and are left out of arrived_p50/arrived_p99"
    ),
    "naive": (
        "bench/one_at_a_time.py: per event one XREADGROUP COUNT 1 on one shard (round-robin), "
        "one EVALSHA of a one-event apply script, one PUBLISH, one XACK; sync redis-py"
    ),
}


def run(args: argparse.Namespace) -> Report:
    environment = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "redis_server": None,
        "platform": platform.platform(),
    }
    config = {
        "events": args.events,
        "jobs": args.jobs,
        "rate": args.rate,
        "seconds": args.seconds,
        "wait_after": args.wait_after,
        "baseline_events": args.baseline_events,
        "baseline_rate": args.baseline_rate,
        "baseline_seconds": args.baseline_seconds,
        "baseline_wait_after": args.baseline_wait_after,
        "batched_read_count": BATCHED_READ_COUNT,
        "shards": FAMILY.shards,
        "repeats": args.repeats,
        "seed": args.seed,
    }
    with redis_servers() as (streams, pubsub):

        def fresh() -> None:
            # A fresh process per phase: empty keyspace, no state keys from the last phase.
            for server in (streams, pubsub):
                server.cleanup()
                server.start()

        def throughput(kind: RouterKind, events: int, jobs: int, note: str = "") -> Throughput:
            step(
                f"throughput, {kind.name}",
                f"{events:,} events, {jobs:,} jobs{note}, {args.repeats} run(s), median kept",
            )
            runs = []
            for _ in range(args.repeats):
                fresh()
                runs.append(
                    measure_throughput(
                        streams, pubsub, kind=kind, events=events, jobs=jobs, seed=args.seed
                    )
                )
            return _median_run(runs)

        def latency(kind: RouterKind, rate: int, seconds: float, wait_after_s: float) -> Latency:
            fresh()
            step(
                f"latency, {kind.name}",
                f"{rate:,} ev/s for {seconds:g} s, then up to {wait_after_s:g} s to deliver",
            )
            return measure_latency(
                streams,
                pubsub,
                kind=kind,
                rate=rate,
                seconds=seconds,
                jobs=max(1, args.jobs // 4),
                wait_after_s=wait_after_s,
            )

        with redis.Redis.from_url(streams.url) as probe:
            environment["redis_server"] = probe.info("server")["redis_version"]

        batched = throughput(BATCHED, args.events, args.jobs)
        report = Report(
            config,
            environment,
            batched,
            latency(BATCHED, args.rate, args.seconds, args.wait_after),
            definitions=DEFINITIONS,
        )
        if args.skip_baseline:
            return report

        baseline_jobs = max(1, min(args.jobs, args.baseline_events // 10))
        capped = " (capped to bound runtime)"
        baseline_latency = (args.baseline_rate, args.baseline_seconds, args.baseline_wait_after)
        naive = report.naive_throughput = throughput(
            NAIVE, args.baseline_events, baseline_jobs, capped
        )
        report.naive_latency = latency(NAIVE, *baseline_latency)
        report.ratios = _ratios(batched, naive, "naive")
        if not args.skip_read_count_1:
            rc1 = report.read_count_1_throughput = throughput(
                READ_COUNT_1, args.baseline_events, baseline_jobs, capped
            )
            report.read_count_1_latency = latency(READ_COUNT_1, *baseline_latency)
            report.ratios |= _ratios(batched, rc1, "read_count_1")
        return report


def _median_run(runs: Sequence[Throughput]) -> Throughput:
    """The run with the median events/s, carrying every run's headline figures."""
    median = sorted(runs, key=lambda t: t.events_per_s)[(len(runs) - 1) // 2]
    median.runs_events_per_s = [round(t.events_per_s) for t in runs]
    median.runs_redis_cpu_us_per_event = [round(t.redis_cpu_us_per_event, 1) for t in runs]
    return median


def _ratios(batched: Throughput, other: Throughput, name: str) -> dict[str, float]:
    return {
        f"throughput_batched_over_{name}": round(batched.events_per_s / other.events_per_s, 2),
        f"redis_cpu_batched_over_{name}": round(
            batched.redis_cpu_us_per_event / other.redis_cpu_us_per_event, 3
        ),
        f"redis_cpu_{name}_over_batched": round(
            other.redis_cpu_us_per_event / batched.redis_cpu_us_per_event, 2
        ),
        f"pubsub_cpu_{name}_over_batched": round(
            other.pubsub_cpu_us_per_event / batched.pubsub_cpu_us_per_event, 2
        ),
        f"worker_cpu_{name}_over_batched": round(
            other.worker_cpu_us_per_event / batched.worker_cpu_us_per_event, 2
        ),
    }


# The table's rows, one column per router: a label and how a column's figure reads.
THROUGHPUT_ROWS: tuple[tuple[str, Callable[[Throughput], str]], ...] = (
    ("one XREADGROUP reads", lambda t: t.reads),
    ("backlog events / jobs", lambda t: f"{t.events:,} / {t.jobs:,}"),
    ("  of which retries / late", lambda t: f"{t.duplicates_added} / {t.late_added}"),
    ("verdicts new/dup/stale/inv", lambda t: _verdicts(t.verdicts)),
    ("mean batch size (entries)", lambda t: _num(t.mean_batch_size, 1)),
    ("drain time (s)", lambda t: f"{t.drain_s:.2f}"),
    ("  wall from router spawn (s)", lambda t: f"{t.wall_from_spawn_s:.2f}"),
    ("throughput (events/s)", lambda t: f"{t.events_per_s:,.0f}"),
    ("  min - max over runs", lambda t: _span(t.runs_events_per_s, "{:,.0f}")),
    ("streams redis CPU (us/event)", lambda t: f"{t.redis_cpu_us_per_event:.1f}"),
    ("  min - max over runs", lambda t: _span(t.runs_redis_cpu_us_per_event, "{:.1f}")),
    ("pubsub redis CPU (us/event)", lambda t: f"{t.pubsub_cpu_us_per_event:.1f}"),
    ("router CPU (us/event)", lambda t: f"{t.worker_cpu_us_per_event:.1f}"),
)
LATENCY_ROWS: tuple[tuple[str, Callable[[Latency], str]], ...] = (
    ("latency: target rate (ev/s)", lambda lat: f"{lat.target_rate:,}"),
    ("  achieved rate x seconds", lambda lat: f"{lat.achieved_rate:,.0f} x {lat.seconds:.1f}"),
    ("  wait after producer (s)", lambda lat: f"{lat.wait_after_producer_s:g}"),
    ("  received / sent", lambda lat: f"{lat.received:,} / {lat.sent:,}"),
    ("  undelivered at deadline", lambda lat: f"{lat.missing_at_deadline:,}"),
    ("  p50 / p90 (ms)", lambda lat: f"{ms(lat.p50_ms)} / {ms(lat.p90_ms)}"),
    ("  p99 / max (ms)", lambda lat: f"{ms(lat.p99_ms)} / {ms(lat.max_ms)}"),
    (
        "  arrived only p50 / p99 (ms)",
        lambda lat: f"{ms(lat.arrived_p50_ms)} / {ms(lat.arrived_p99_ms)}",
    ),
    ("  drained after producer (s)", lambda lat: _num(lat.drained_after_producer_s, 2, "no")),
)


def print_report(report: Report) -> None:
    columns = [("batched", report.batched_throughput, report.batched_latency)]
    if report.naive_throughput is not None and report.naive_latency is not None:
        columns.append(("naive one-at-a-time", report.naive_throughput, report.naive_latency))
    if report.read_count_1_throughput is not None and report.read_count_1_latency is not None:
        columns.append(
            ("worker READ_COUNT=1", report.read_count_1_throughput, report.read_count_1_latency)
        )

    def row(label: str, *values: str) -> None:
        print(f"{label:<31}" + "".join(f"{v:>23}" for v in values))

    env = report.environment
    print()
    print(
        f"eco-router benchmark: {env['cpus']} CPUs, Python {env['python']}, "
        f"redis-server {env['redis_server']}, {FAMILY.shards} shards"
    )
    row("", *(name for name, _, _ in columns))
    for label, throughput_cell in THROUGHPUT_ROWS:
        row(label, *(throughput_cell(t) for _, t, _ in columns))
    for label, latency_cell in LATENCY_ROWS:
        row(label, *(latency_cell(lat) for _, _, lat in columns))
    print("streams redis server time per event by command (INFO commandstats, us):")
    for name, t, _ in columns:
        print(f"  {name}: {_command_breakdown(t.redis_usec_per_event_by_command)}")
    r = report.ratios
    if "throughput_batched_over_naive" in r:
        print(
            f"HEADLINE batched / naive one-at-a-time: throughput "
            f"{r['throughput_batched_over_naive']}x; streams redis CPU per event "
            f"{r['redis_cpu_batched_over_naive']}x (naive spends "
            f"{r['redis_cpu_naive_over_batched']}x as much)"
        )
        print(
            f"  naive / batched CPU per event: pubsub redis {r['pubsub_cpu_naive_over_batched']}x, "
            f"router process {r['worker_cpu_naive_over_batched']}x"
        )
    if "throughput_batched_over_read_count_1" in r:
        print(
            f"secondary, batched / worker READ_COUNT=1: throughput "
            f"{r['throughput_batched_over_read_count_1']}x; streams redis CPU per event "
            f"{r['redis_cpu_batched_over_read_count_1']}x (READ_COUNT=1 spends "
            f"{r['redis_cpu_read_count_1_over_batched']}x as much)"
        )
    if r:
        print(
            "note: the baselines drain a smaller backlog and run a shorter paced run to bound "
            f"the runtime; READ_COUNT=1 is per stream, so the worker still reads up to "
            f"{FAMILY.shards} entries (one per shard) and applies them in one script call"
        )
    print("definitions:")
    for name, text in report.definitions.items():
        print(f"  {name}: {text}")


def _command_breakdown(usec: dict[str, float]) -> str:
    """EVALSHA with the calls made inside it (commandstats counts those twice), then the rest."""
    inside = ", ".join(f"{c} {u}" for c, u in usec.items() if c in SCRIPT_COMMANDS)
    rest = [
        f"{c} {u}" for c, u in usec.items() if c not in SCRIPT_COMMANDS and c != "evalsha" and u
    ]
    return f"evalsha {usec.get('evalsha', 0)} (inside: {inside}); " + ", ".join(rest)


def _span(values: Sequence[float], spec: str) -> str:
    return f"{spec.format(min(values))} - {spec.format(max(values))}" if values else "n/a"


def _verdicts(verdicts: dict[str, int]) -> str:
    return "/".join(str(verdicts.get(v, 0)) for v in ("new", "duplicate", "stale", "invalid"))


def _num(value: float | None, digits: int, missing: str = "n/a") -> str:
    return missing if value is None else f"{value:.{digits}f}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.router_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--events", type=int, default=20_000, help="backlog size (default 20000)")
    parser.add_argument(
        "--jobs", type=int, default=2_000, help="jobs in the backlog (default 2000)"
    )
    parser.add_argument("--rate", type=int, default=5_000, help="paced events/s (default 5000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="paced run length (default 5)")
    parser.add_argument(
        "--skip-baseline", action="store_true", help="skip the naive and READ_COUNT=1 runs"
    )
    parser.add_argument(
        "--skip-read-count-1", action="store_true", help="skip the worker READ_COUNT=1 runs"
    )
    parser.add_argument(
        "--baseline-events", type=int, default=5_000, help="baseline backlog (default 5000)"
    )
    parser.add_argument("--baseline-rate", type=int, default=None, help="default: --rate")
    parser.add_argument("--baseline-seconds", type=float, default=2.0)
    parser.add_argument(
        "--baseline-wait-after",
        type=float,
        default=3.0,
        help="baseline runs: seconds to wait for delivery after the producer stops (default 3)",
    )
    parser.add_argument(
        "--wait-after",
        type=float,
        default=10.0,
        help="seconds to wait for the router after the producer stops (default 10)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="drains per throughput phase, the median reported (default 3)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if args.baseline_rate is None:
        args.baseline_rate = args.rate
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(run, print_report, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
