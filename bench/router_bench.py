"""Router benchmark: throughput, Redis CPU per event and end-to-end latency of `eco-router worker`.

Run from the repository root: `.venv/bin/python -m bench.router_bench` (or `make bench`).

Every run gets freshly started throwaway redis-server processes (one for streams, one for
Pub/Sub) and fresh router subprocesses, so runs do not see each other's data or state keys.
Runs of the columns being compared are interleaved (A, B, C, B, C, A, ...) and each column
reports medians over the rounds, so a machine that slows down for a while slows every column
alike.

1. One router with and without the order mechanism: this tree's worker (order by shard
   leases) next to the worker of a baseline commit from before the leases (`--baseline-ref`),
   with its per-batch order check switched off (EVENT_ROUTER_ORDER_WAIT_MS=0) and on (its
   default).
2. 1, 2 and 4 routers of this tree draining the same backlog: events/s, streams Redis CPU
   per event, each router's share.
3. Batching: the worker next to `bench/one_at_a_time.py`, a naive router that reads,
   applies, publishes and acks one event at a time (smaller backlog, bounded paced run), and,
   as a secondary figure, the worker at EVENT_ROUTER_READ_COUNT=1.
4. Topologies: one router draining the same backlog on one server, a Sentinel group and a
   3-master Redis Cluster: events/s, CPU per event of every master and replica, balance.
   `--only topologies` runs this section alone.

Throughput: the four `scan:events` shards are pre-filled with a realistic mix (retried
duplicates, late events) out of the group's sight; once every router reads, the whole backlog
is shown to the group at once and the routers drain it. Latency: a producer process XADDs at a
paced rate while this process, psubscribed to `sse:events:*`, timestamps every published
payload; latency = receive time - entry id time.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import select
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median_low
from typing import Any, TypeVar

import hiredis
import orjson
import redis

from bench.backlog import (
    FAMILY,
    Workload,
    fill_hidden,
    group_state,
    make_workload,
    open_gate,
    stream_of,
)
from bench.baseline_source import BaselineSource, BaselineUnavailable, baseline_source
from bench.goals import goal_lines, inside_scripts
from bench.pacing import Pacer
from bench.producer_process import ProducerProcess
from bench.redis_probes import POLL_INTERVAL_S, command_usec, redis_cpu_seconds, watch_drain
from bench.redis_servers import redis_servers
from bench.reporting import RESULTS_DIR, ms, percentile, run_benchmark, step
from bench.router_process import RouterProcess
from bench.routers import BATCHED_READ_COUNT, PLAIN_BATCH_MODULE, RouterKind, wait_until_reading
from bench.topologies import TOPOLOGIES, Topology
from bench.topology_drain import DEFINITIONS as TOPOLOGY_DEFINITIONS
from bench.topology_drain import (
    TopologyDrain,
    comparison,
    measure_topology_drain,
    median_topology_drain,
)
from bench.topology_drain import print_section as print_topology_section
from eco_router.testing import RedisServer

T = TypeVar("T")

CHANNEL_PATTERN = "sse:events:*"
RESULTS_PATH = RESULTS_DIR / "router.json"
DEFAULT_BASELINE_REF = "5c0e832"
ORDER_WAIT_SETTING = "EVENT_ROUTER_ORDER_WAIT_MS"
# The columns that drain the smaller backlog and run the shorter paced run.
SMALLER_RUNS = frozenset({"naive", "read_count_1"})


# What a full run and a --quick one use for every option left unset.
FULL = {
    "events": 20_000,
    "jobs": 2_000,
    "seconds": 5.0,
    "wait_after": 10.0,
    "repeats": 5,
    "latency_repeats": 5,
    "baseline_events": 5_000,
    "baseline_seconds": 2.0,
    "baseline_wait_after": 3.0,
    "topology_events": 20_000,
    "topology_repeats": 5,
    "rates_seconds": 3.0,
    "rates_repeats": 3,
}
QUICK = {
    "events": 5_000,
    "jobs": 500,
    "seconds": 2.0,
    "wait_after": 5.0,
    "repeats": 1,
    "latency_repeats": 1,
    "baseline_events": 2_000,
    "baseline_seconds": 1.0,
    "baseline_wait_after": 2.0,
    # A 5,000-event drain takes ~0.2 s, too close to the 10 ms drain poll; three rounds give
    # a median where one gives a sample.
    "topology_events": 10_000,
    "topology_repeats": 3,
    "rates_seconds": 1.5,
    "rates_repeats": 1,
}


# --------------------------------------------------------------------------- the columns


@dataclass(frozen=True, slots=True)
class Columns:
    """The router kinds of one run, by section; absent ones were skipped."""

    leases: RouterKind
    no_check: RouterKind | None
    check: RouterKind | None
    scaling: tuple[RouterKind, ...]  # leases with 1, then 2, 4, ... routers
    naive: RouterKind | None
    read_count_1: RouterKind | None
    plain: RouterKind | None = None

    def throughput_kinds(self) -> list[RouterKind]:
        """One round of drains, in the order they run."""
        kinds = [self.leases, self.no_check, self.check, *self.scaling[1:]]
        kinds += [self.plain, self.naive, self.read_count_1]
        return [k for k in kinds if k is not None]

    def latency_kinds(self) -> list[RouterKind]:
        """One round of paced runs, in the order they run."""
        kinds = [self.leases, self.no_check, self.check, self.plain, self.naive, self.read_count_1]
        return [k for k in kinds if k is not None]

    def rate_kinds(self) -> list[RouterKind]:
        """One round of the paced runs at each of --rates: this tree, the baseline with its
        defaults, the plain batch and the naive router."""
        kinds = [self.leases, self.no_check, self.plain, self.naive]
        return [k for k in kinds if k is not None]


def make_columns(args: argparse.Namespace, baseline: BaselineSource | None) -> Columns:
    leases = RouterKind("leases", "leases (this tree)", BATCHED_READ_COUNT)
    scaling = [leases]
    scaling += [
        RouterKind(f"leases_{n}_routers", f"{n} routers", BATCHED_READ_COUNT, routers=n)
        for n in args.routers
        if n > 1
    ]
    no_check = check = None
    if baseline is not None and args.baseline_default_only:
        no_check = RouterKind(
            "baseline_no_check",
            f"{baseline.commit} (defaults)",
            BATCHED_READ_COUNT,
            source=baseline,
        )
    elif baseline is not None:
        no_check = RouterKind(
            "baseline_no_check",
            f"{baseline.commit} check off",
            BATCHED_READ_COUNT,
            source=baseline,
            settings=((ORDER_WAIT_SETTING, "0"),),
        )
        # Its own default wait (1000 ms at the default ref): the design as it shipped.
        check = RouterKind(
            "baseline_check", f"{baseline.commit} check on", BATCHED_READ_COUNT, source=baseline
        )
    naive = read_count_1 = None
    if not args.skip_baseline:
        naive = RouterKind("naive", "naive one-at-a-time", None)
        if not args.skip_read_count_1:
            read_count_1 = RouterKind("read_count_1", "worker READ_COUNT=1", 1)
    plain = None
    if not args.skip_plain_batch:
        plain = RouterKind("plain_batch", "plain batch", None, module=PLAIN_BATCH_MODULE)
    return Columns(leases, no_check, check, tuple(scaling), naive, read_count_1, plain)


@contextmanager
def running(
    kind: RouterKind, streams: RedisServer, pubsub: RedisServer, *, phase: str
) -> Iterator[list[RouterProcess]]:
    """`kind`'s router processes, stopped (last started first) on the way out."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(kind.spawn(streams.url, pubsub.url, name=name))
            for name in kind.names(phase)
        ]


# --------------------------------------------------------------------------- throughput


@dataclass(slots=True)
class Throughput:
    """A drain of a pre-filled backlog by one or more routers."""

    router: str
    reads: str
    routers: int
    events: int
    jobs: int
    duplicates_added: int
    late_added: int
    fill_s: float
    startup_s: float
    drain_s: float
    events_per_s: float
    redis_cpu_us_per_event: float
    pubsub_cpu_us_per_event: float
    worker_cpu_us_per_event: float
    mean_batch_size: float | None
    verdicts: dict[str, int]
    # Per router, in start order: shards held when the drain began, share of the events.
    shards_held: list[int]
    shares: list[float]
    redis_usec_per_event_by_command: dict[str, float]
    # Every repeat, in run order. Above: the run with the median events/s, its CPU figures
    # replaced by their own medians over the runs.
    runs_events_per_s: list[float] = field(default_factory=list)
    runs_redis_cpu_us_per_event: list[float] = field(default_factory=list)


def measure_throughput(
    streams: RedisServer, pubsub: RedisServer, *, kind: RouterKind, workload: Workload
) -> Throughput:
    client = redis.Redis.from_url(streams.url)
    pubsub_client = redis.Redis.from_url(pubsub.url)
    try:
        backlog = fill_hidden(client, workload)
        spawned = time.monotonic()
        with running(kind, streams, pubsub, phase="drain") as routers:
            held = wait_until_reading(client, routers)
            startup_s = time.monotonic() - spawned
            client.config_resetstat()
            cpu_before = redis_cpu_seconds(client)
            pubsub_cpu_before = redis_cpu_seconds(pubsub_client)
            router_cpu_before = sum(r.cpu_seconds() for r in routers)
            opened_at = open_gate(client, backlog)
            drained_at = watch_drain(client, routers, backlog.events)
            router_cpu = sum(r.cpu_seconds() for r in routers) - router_cpu_before
            cpu_after = redis_cpu_seconds(client)
            pubsub_cpu_seconds = redis_cpu_seconds(pubsub_client) - pubsub_cpu_before
            usec = command_usec(client)
        figures = [r.figures for r in routers]  # collected as each stopped
    finally:
        client.close()
        pubsub_client.close()
    events = backlog.events
    drain_s = drained_at - opened_at
    routed = [sum(f.get(v, 0.0) for v in ("new", "duplicate", "stale", "invalid")) for f in figures]
    batches = sum(f.get("batch_size_count", 0.0) for f in figures)
    return Throughput(
        router=kind.title,
        reads=kind.reads,
        routers=kind.routers,
        events=events,
        jobs=workload.jobs,
        duplicates_added=workload.duplicates,
        late_added=workload.late,
        fill_s=backlog.fill_s,
        startup_s=startup_s,
        drain_s=drain_s,
        events_per_s=events / drain_s,
        redis_cpu_us_per_event=(cpu_after - cpu_before) * 1e6 / events,
        pubsub_cpu_us_per_event=pubsub_cpu_seconds * 1e6 / events,
        worker_cpu_us_per_event=router_cpu * 1e6 / events,
        mean_batch_size=(
            sum(f.get("batch_size_sum", 0.0) for f in figures) / batches if batches else None
        ),
        verdicts={
            v: int(sum(f.get(v, 0.0) for f in figures))
            for v in ("new", "duplicate", "stale", "invalid")
            if any(v in f for f in figures)
        },
        shards_held=[held[r.name] for r in routers],
        shares=[n / sum(routed) if sum(routed) else math.nan for n in routed],
        redis_usec_per_event_by_command={
            name: round(us / events, 2)
            for name, us in sorted(usec.items(), key=lambda item: -item[1])
            if name not in ("config|resetstat", "info")
        },
    )


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
    # Every repeat, in run order. Above: the run with the median p99, its percentiles
    # replaced by their own medians over the runs.
    runs_p50_ms: list[float | None] = field(default_factory=list)
    runs_p99_ms: list[float | None] = field(default_factory=list)
    # From just before the producer starts to the drain (or the deadline), per event sent:
    # idle costs (heartbeats, blocked reads) included.
    router_cpu_us_per_event: float = math.nan
    redis_cpu_us_per_event: float = math.nan
    pubsub_cpu_us_per_event: float = math.nan
    redis_usec_per_event_by_command: dict[str, float] = field(default_factory=dict)


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
    pubsub_client = redis.Redis.from_url(pubsub.url)
    try:
        with running(kind, streams, pubsub, phase="live") as routers:
            wait_until_reading(client, routers)
            subscriber = Subscriber(pubsub.port)
            try:
                client.config_resetstat()
                cpu_before = redis_cpu_seconds(client)
                pubsub_cpu_before = redis_cpu_seconds(pubsub_client)
                router_cpu_before = sum(r.cpu_seconds() for r in routers)
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
                router_cpu = sum(r.cpu_seconds() for r in routers) - router_cpu_before
                redis_cpu = redis_cpu_seconds(client) - cpu_before
                pubsub_cpu = redis_cpu_seconds(pubsub_client) - pubsub_cpu_before
                usec = command_usec(client)
            finally:
                subscriber.close()
    finally:
        client.close()
        pubsub_client.close()

    latencies = sorted(
        received_at * 1000 - int(orjson.loads(payload)["stream_id"].partition("-")[0])
        for received_at, payload in subscriber.received
    )
    missing = max(0, sent - len(latencies))
    # Payloads not received by the deadline count as infinitely late, not as absent.
    ranked = latencies + [math.inf] * missing
    return Latency(
        router=kind.title,
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
        router_cpu_us_per_event=router_cpu * 1e6 / max(1, sent),
        redis_cpu_us_per_event=redis_cpu * 1e6 / max(1, sent),
        pubsub_cpu_us_per_event=pubsub_cpu * 1e6 / max(1, sent),
        redis_usec_per_event_by_command={
            name: round(us / max(1, sent), 2)
            for name, us in sorted(usec.items(), key=lambda item: -item[1])
            if name not in ("config|resetstat", "info", "xinfo|groups")
        },
    )


def _drained_within(client: redis.Redis, *, deadline: float) -> float | None:
    while True:
        if group_state(client).drained:
            return time.monotonic()
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL_INTERVAL_S)


# --------------------------------------------------------------------------- orchestration


@dataclass(slots=True)
class Report:
    config: dict[str, Any]
    environment: dict[str, Any]
    # The commit of sections 1's baseline columns, or why they were skipped.
    baseline: dict[str, str | None]
    # Per column key (RouterKind.key): the medians over the rounds.
    throughput: dict[str, Throughput]
    latency: dict[str, Latency]
    # The paced runs at each of --rates: rate -> column key -> the medians over the rounds.
    rates: dict[int, dict[str, Latency]] = field(default_factory=dict)
    # Section 4, per topology key: the medians over the rounds.
    topologies: dict[str, TopologyDrain] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)


DEFINITIONS = {
    "events_per_s": (
        "entries drained / (t_drained - t_open); the backlog is written before the routers "
        "start, with the group at the end of every shard and each shard's last entry held "
        "back; once every router reads (one of its streams connections last sent XREAD or "
        "XREADGROUP, CLIENT LIST; with several routers, besides, every shard's lease has an "
        "owner, the owners are balanced and each of them reads), one MULTI "
        "moves the group to 0 and adds the held-back entries: t_open is just before it; "
        f"t_drained = first XINFO GROUPS poll (every {POLL_INTERVAL_S * 1000:.0f} ms) showing "
        "lag 0 and pending 0 on all 4 shards. Router start-up is excluded and shown as startup_s"
    ),
    "startup_s": "router spawn to every router reading its shards (before t_open)",
    "medians": (
        "events/s and each CPU per event figure are the median (the lower of an even count) "
        "over the rounds, each taken on its own; the other drain figures (drain time, "
        "verdicts, batch size, shares, commandstats) are those of the run with the median "
        "events/s"
    ),
    "redis_cpu_us_per_event": (
        "streams redis-server used_cpu_sys + used_cpu_user (INFO cpu) at t_drained minus at "
        "t_open, per entry; includes the benchmark's own XINFO polling and the routers' "
        "heartbeats"
    ),
    "worker_cpu_us_per_event": (
        "utime + stime (/proc) of all the routers of a column from t_open to t_drained, per entry"
    ),
    "shares": (
        "each router's verdict count (new + duplicate + stale + invalid, its /metrics) over "
        "the sum of all routers'; shards held = leases held at t_open"
    ),
    "latency": (
        "subscriber receive time (time.time() when the socket chunk was read) - the entry id's "
        "millisecond part (redis-server clock, same host); the id truncates to the millisecond, "
        "so figures read up to 1 ms high; payloads not received by the deadline rank as infinite "
        "in p50..max, and are left out of arrived_p50/arrived_p99; each percentile is the median "
        "(the lower of an even count) of that percentile over the rounds"
    ),
    "baseline": (
        "the worker of --baseline-ref (src/ extracted with git archive into a temporary "
        "directory, run with this interpreter and PYTHONPATH=<it>/src): per batch, a Lua check "
        "for older entries of the same jobs pending at other consumers, waiting up to "
        "EVENT_ROUTER_ORDER_WAIT_MS (0 = check off; its default 1000 = check on)"
    ),
    "naive": (
        "bench/one_at_a_time.py: per event one XREADGROUP COUNT 1 on one shard (round-robin), "
        "one EVALSHA of a one-event apply script, one PUBLISH, one XACK; sync redis-py"
    ),
}


def run(args: argparse.Namespace) -> Report:
    with ExitStack() as stack:
        baseline: BaselineSource | None = None
        skipped: str | None = None
        if args.only == "topologies":
            skipped = "--only topologies"
        elif args.baseline_ref.lower() == "none":
            skipped = "--baseline-ref none"
        else:
            try:
                baseline = stack.enter_context(
                    baseline_source(args.baseline_ref, args.baseline_python)
                )
            except BaselineUnavailable as reason:
                skipped = f"{args.baseline_ref} unavailable: {reason}"
        if baseline is not None:
            step("baseline", f"{baseline.title}, extracted to {baseline.src}")
        else:
            step("baseline", f"skipped ({skipped})")
        columns = make_columns(args, baseline)
        report = Report(
            config=_config(args),
            environment={
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "redis_server": None,
                "platform": platform.platform(),
            },
            baseline={
                "ref": args.baseline_ref,
                "commit": baseline.commit if baseline else None,
                "subject": baseline.subject if baseline else None,
                "skipped": skipped,
            },
            throughput={},
            latency={},
            definitions={**DEFINITIONS, **TOPOLOGY_DEFINITIONS},
        )
        if args.only != "topologies":
            _measure(args, columns, report)
        if not args.skip_topologies:
            _measure_topologies(args, report)
        report.ratios = {**_ratios(report), **comparison(report.topologies)}
        return report


def _measure(args: argparse.Namespace, columns: Columns, report: Report) -> None:
    workloads = {
        "main": make_workload(args.events, args.jobs, args.seed),
        "baseline": make_workload(args.baseline_events, _baseline_jobs(args), args.seed),
    }

    def workload_of(kind: RouterKind) -> Workload:
        return workloads["baseline" if kind.key in SMALLER_RUNS else "main"]

    with redis_servers() as (streams, pubsub):

        def fresh() -> None:
            # Fresh processes per run: empty keyspace, no state keys from the last run.
            for server in (streams, pubsub):
                server.cleanup()
                server.start()

        with redis.Redis.from_url(streams.url) as probe:
            report.environment["redis_server"] = probe.info("server")["redis_version"]

        kinds = columns.throughput_kinds()
        step(
            "throughput",
            f"{len(kinds)} columns x {args.repeats} interleaved round(s): "
            + ", ".join(k.title for k in kinds),
        )
        drains: dict[str, list[Throughput]] = {k.key: [] for k in kinds}
        for round_ in range(1, args.repeats + 1):
            for kind in _rotated(kinds, round_):
                fresh()
                drain = measure_throughput(streams, pubsub, kind=kind, workload=workload_of(kind))
                drains[kind.key].append(drain)
                step(
                    f"round {round_}/{args.repeats}",
                    f"{kind.title}: {drain.events:,} events in {drain.drain_s:.2f} s, "
                    f"{drain.events_per_s:,.0f} ev/s, {drain.redis_cpu_us_per_event:.1f} us/event",
                )
        report.throughput = {key: _median_run(runs) for key, runs in drains.items()}

        if args.latency_repeats >= 1:
            _measure_latency(args, columns, report, fresh, (streams, pubsub))
        _measure_rates(args, columns, report, (streams, pubsub), fresh)


def _measure_latency(
    args: argparse.Namespace,
    columns: Columns,
    report: Report,
    fresh: Callable[[], None],
    servers: tuple[RedisServer, RedisServer],
) -> None:
    streams, pubsub = servers
    kinds = columns.latency_kinds()
    step(
        "latency",
        f"{len(kinds)} columns x {args.latency_repeats} interleaved round(s), paced "
        f"{args.rate:,} ev/s for {args.seconds:g} s (baselines {args.baseline_rate:,} ev/s "
        f"for {args.baseline_seconds:g} s)",
    )
    paced: dict[str, list[Latency]] = {k.key: [] for k in kinds}
    for round_ in range(1, args.latency_repeats + 1):
        for kind in _rotated(kinds, round_):
            fresh()
            smaller = kind.key in SMALLER_RUNS
            paced_run = measure_latency(
                streams,
                pubsub,
                kind=kind,
                rate=args.baseline_rate if smaller else args.rate,
                seconds=args.baseline_seconds if smaller else args.seconds,
                jobs=max(1, args.jobs // 4),
                wait_after_s=args.baseline_wait_after if smaller else args.wait_after,
            )
            paced[kind.key].append(paced_run)
            step(
                f"round {round_}/{args.latency_repeats}",
                f"{kind.title}: p50 {ms(paced_run.p50_ms)} ms, p99 {ms(paced_run.p99_ms)} ms, "
                f"{paced_run.received:,} / {paced_run.sent:,} received",
            )
    report.latency = {key: _median_latency(runs) for key, runs in paced.items()}


def _measure_rates(
    args: argparse.Namespace,
    columns: Columns,
    report: Report,
    servers: tuple[RedisServer, RedisServer],
    fresh: Callable[[], None],
) -> None:
    """The paced runs at each of `args.rates`, the columns interleaved in every round."""
    kinds = columns.rate_kinds()
    if not args.rates or args.rates_repeats < 1:
        return
    streams, pubsub = servers
    step(
        "rates",
        f"{len(kinds)} columns x {len(args.rates)} rates x {args.rates_repeats} interleaved "
        f"round(s), {args.rates_seconds:g} s each: "
        + ", ".join(f"{rate:,}" for rate in args.rates)
        + " ev/s",
    )
    paced: dict[int, dict[str, list[Latency]]] = {
        rate: {k.key: [] for k in kinds} for rate in args.rates
    }
    for round_ in range(1, args.rates_repeats + 1):
        for rate in args.rates:
            for kind in _rotated(kinds, round_):
                fresh()
                run = measure_latency(
                    streams,
                    pubsub,
                    kind=kind,
                    rate=rate,
                    seconds=args.rates_seconds,
                    jobs=max(1, args.jobs // 4),
                    wait_after_s=args.baseline_wait_after
                    if kind.key == "naive"
                    else args.wait_after,
                )
                paced[rate][kind.key].append(run)
                step(
                    f"round {round_}/{args.rates_repeats} {rate:,} ev/s",
                    f"{kind.title}: p50 {ms(run.p50_ms)} ms, p99 {ms(run.p99_ms)} ms, "
                    f"router {run.router_cpu_us_per_event:.0f} us/event, streams redis "
                    f"{run.redis_cpu_us_per_event:.0f} us/event",
                )
    report.rates = {
        rate: {key: _median_latency(runs) for key, runs in by_key.items()}
        for rate, by_key in paced.items()
    }


def _measure_topologies(args: argparse.Namespace, report: Report) -> None:
    """Section 4: the topologies' drains, interleaved over `args.topology_repeats` rounds, each on a
    fresh topology and a fresh Pub/Sub server."""
    kind = RouterKind(
        "topology",
        "leases (this tree)",
        BATCHED_READ_COUNT,
        settings=(("EVENT_ROUTER_STREAMS", f"{FAMILY.prefix}={args.topology_shards}"),),
    )
    workloads: dict[bool, Workload] = {}
    step(
        "topologies",
        f"{len(TOPOLOGIES)} columns x {args.topology_repeats} interleaved round(s): "
        + ", ".join(t.title for t in TOPOLOGIES),
    )
    drains: dict[str, list[TopologyDrain]] = {t.key: [] for t in TOPOLOGIES}
    for round_ in range(1, args.topology_repeats + 1):
        for topology_class in _rotated(TOPOLOGIES, round_):
            topology: Topology = topology_class(args.topology_shards)
            family = topology.family
            if family.tagged not in workloads:
                # The same entries for both layouts; only the shard names differ.
                workloads[family.tagged] = make_workload(
                    args.topology_events, args.jobs, args.seed, family
                )
            with topology, RedisServer() as pubsub:
                if report.environment["redis_server"] is None:
                    with redis.Redis.from_url(pubsub.url) as probe:
                        report.environment["redis_server"] = probe.info("server")["redis_version"]
                column = dataclasses.replace(
                    kind, settings=(*kind.settings, *topology.router_settings)
                )
                drain = measure_topology_drain(
                    topology, pubsub, kind=column, workload=workloads[family.tagged]
                )
            drains[topology.key].append(drain)
            balance = (
                "" if drain.master_balance is None else f", balance {drain.master_balance:.2f}"
            )
            step(
                f"round {round_}/{args.topology_repeats}",
                f"{topology.title}: {drain.events:,} events in {drain.drain_s:.2f} s, "
                f"{drain.events_per_s:,.0f} ev/s, masters {drain.masters_cpu_us_per_event:.1f} "
                f"us/event{balance}",
            )
    report.topologies = {key: median_topology_drain(runs) for key, runs in drains.items()}


def _rotated(kinds: Sequence[T], round_: int) -> list[T]:
    """The columns in the order of round `round_`: each round starts one column later, so no
    column always runs first (on a freshly started server) or last."""
    start = (round_ - 1) % len(kinds)
    return [*kinds[start:], *kinds[:start]]


def _baseline_jobs(args: argparse.Namespace) -> int:
    jobs: int = args.jobs
    events: int = args.baseline_events
    return max(1, min(jobs, events // 10))


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "quick": args.quick,
        "events": args.events,
        "jobs": args.jobs,
        "rate": args.rate,
        "seconds": args.seconds,
        "wait_after": args.wait_after,
        "repeats": args.repeats,
        "latency_repeats": args.latency_repeats,
        "routers": args.routers,
        "baseline_ref": args.baseline_ref,
        "baseline_events": args.baseline_events,
        "baseline_jobs": _baseline_jobs(args),
        "baseline_rate": args.baseline_rate,
        "baseline_seconds": args.baseline_seconds,
        "baseline_wait_after": args.baseline_wait_after,
        "batched_read_count": BATCHED_READ_COUNT,
        "shards": FAMILY.shards,
        "only": args.only,
        "skip_topologies": args.skip_topologies,
        "topology_events": args.topology_events,
        "topology_repeats": args.topology_repeats,
        "topology_shards": args.topology_shards,
        "rates": args.rates,
        "rates_seconds": args.rates_seconds,
        "rates_repeats": args.rates_repeats,
        "seed": args.seed,
    }


def _median_run(runs: Sequence[Throughput]) -> Throughput:
    """The run with the median events/s, its rates and CPU figures each the median over runs.

    Each figure's own median (the lower one of an even count: a measured value): the run with
    the median events/s need not be the one with the median CPU per event.
    """
    median = sorted(runs, key=lambda t: t.events_per_s)[(len(runs) - 1) // 2]
    median.runs_events_per_s = [round(t.events_per_s) for t in runs]
    median.runs_redis_cpu_us_per_event = [round(t.redis_cpu_us_per_event, 1) for t in runs]
    median.redis_cpu_us_per_event = median_low(t.redis_cpu_us_per_event for t in runs)
    median.pubsub_cpu_us_per_event = median_low(t.pubsub_cpu_us_per_event for t in runs)
    median.worker_cpu_us_per_event = median_low(t.worker_cpu_us_per_event for t in runs)
    return median


def _median_latency(runs: Sequence[Latency]) -> Latency:
    """The run with the median p99, each percentile the median over runs (None: infinite)."""
    median = sorted(runs, key=lambda lat: _finite(lat.p99_ms))[(len(runs) - 1) // 2]
    median.runs_p50_ms = [lat.p50_ms for lat in runs]
    median.runs_p99_ms = [lat.p99_ms for lat in runs]
    for name in ("p50_ms", "p90_ms", "max_ms", "arrived_p50_ms", "arrived_p99_ms"):
        value = median_low(_finite(getattr(lat, name)) for lat in runs)
        setattr(median, name, None if math.isinf(value) else value)
    for name in ("router_cpu_us_per_event", "redis_cpu_us_per_event", "pubsub_cpu_us_per_event"):
        setattr(median, name, median_low(getattr(lat, name) for lat in runs))
    return median


def _finite(value: float | None) -> float:
    return math.inf if value is None else value


def _ratios(report: Report) -> dict[str, float]:
    t, lat = report.throughput, report.latency
    ratios: dict[str, float] = {}

    def compare(name: str, key: str, base: str) -> None:
        if key not in t or base not in t:
            return
        a, b = t[key], t[base]
        ratios[f"throughput_{name}"] = round(a.events_per_s / b.events_per_s, 3)
        ratios[f"redis_cpu_{name}"] = round(a.redis_cpu_us_per_event / b.redis_cpu_us_per_event, 3)
        ratios[f"pubsub_cpu_{name}"] = round(
            a.pubsub_cpu_us_per_event / b.pubsub_cpu_us_per_event, 3
        )
        ratios[f"worker_cpu_{name}"] = round(
            a.worker_cpu_us_per_event / b.worker_cpu_us_per_event, 3
        )
        if key in lat and base in lat and lat[key].p99_ms and lat[base].p99_ms:
            ratios[f"p99_{name}"] = round(lat[key].p99_ms / lat[base].p99_ms, 3)  # type: ignore[operator]

    compare("leases_over_no_check", "leases", "baseline_no_check")
    compare("check_over_no_check", "baseline_check", "baseline_no_check")
    for key in t:
        if key.startswith("leases_") and key.endswith("_routers"):
            compare(f"{key.removeprefix('leases_')}_over_1", key, "leases")
    compare("batched_over_naive", "leases", "naive")
    compare("naive_over_batched", "naive", "leases")
    compare("batched_over_read_count_1", "leases", "read_count_1")
    compare("read_count_1_over_batched", "read_count_1", "leases")
    compare("leases_over_plain", "leases", "plain_batch")
    compare("baseline_over_plain", "baseline_no_check", "plain_batch")
    compare("leases_over_baseline", "leases", "baseline_no_check")
    for rate, runs in report.rates.items():
        for name, key, base in (
            ("leases_over_plain", "leases", "plain_batch"),
            ("baseline_over_plain", "baseline_no_check", "plain_batch"),
            ("leases_over_baseline", "leases", "baseline_no_check"),
        ):
            if key not in runs or base not in runs:
                continue
            a, b = runs[key], runs[base]
            for figure in ("router_cpu", "redis_cpu", "pubsub_cpu"):
                ratios[f"paced_{rate}_{figure}_{name}"] = round(
                    getattr(a, f"{figure}_us_per_event") / getattr(b, f"{figure}_us_per_event"), 3
                )
            if a.p99_ms and b.p99_ms:
                ratios[f"paced_{rate}_p99_{name}"] = round(a.p99_ms / b.p99_ms, 3)
    return ratios


# --------------------------------------------------------------------------- the table

Cell = Callable[[Throughput], str]
LatencyCell = Callable[[Latency], str]

THROUGHPUT_ROWS: tuple[tuple[str, Cell], ...] = (
    ("one XREADGROUP reads", lambda t: t.reads),
    ("backlog events / jobs", lambda t: f"{t.events:,} / {t.jobs:,}"),
    ("  of which retries / late", lambda t: f"{t.duplicates_added} / {t.late_added}"),
    ("verdicts new/dup/stale/inv", lambda t: _verdicts(t.verdicts)),
    ("mean batch size (entries)", lambda t: _num(t.mean_batch_size, 1)),
    ("drain time (s)", lambda t: f"{t.drain_s:.2f}"),
    ("  router start-up (s)", lambda t: f"{t.startup_s:.2f}"),
    ("throughput (events/s)", lambda t: f"{t.events_per_s:,.0f}"),
    ("  min - max over runs", lambda t: _span(t.runs_events_per_s, "{:,.0f}")),
    ("streams redis CPU (us/event)", lambda t: f"{t.redis_cpu_us_per_event:.1f}"),
    ("  min - max over runs", lambda t: _span(t.runs_redis_cpu_us_per_event, "{:.1f}")),
    ("pubsub redis CPU (us/event)", lambda t: f"{t.pubsub_cpu_us_per_event:.1f}"),
    ("router CPU (us/event)", lambda t: f"{t.worker_cpu_us_per_event:.1f}"),
)
SCALING_ROWS: tuple[tuple[str, Cell], ...] = (
    ("shards held per router", lambda t: "/".join(map(str, t.shards_held))),
    ("share of events per router (%)", lambda t: "/".join(f"{s * 100:.0f}" for s in t.shares)),
    ("verdicts new/dup/stale/inv", lambda t: _verdicts(t.verdicts)),
    ("mean batch size (entries)", lambda t: _num(t.mean_batch_size, 1)),
    ("drain time (s)", lambda t: f"{t.drain_s:.2f}"),
    ("  router start-up (s)", lambda t: f"{t.startup_s:.2f}"),
    ("throughput (events/s)", lambda t: f"{t.events_per_s:,.0f}"),
    ("  min - max over runs", lambda t: _span(t.runs_events_per_s, "{:,.0f}")),
    ("streams redis CPU (us/event)", lambda t: f"{t.redis_cpu_us_per_event:.1f}"),
    ("  min - max over runs", lambda t: _span(t.runs_redis_cpu_us_per_event, "{:.1f}")),
    ("pubsub redis CPU (us/event)", lambda t: f"{t.pubsub_cpu_us_per_event:.1f}"),
    ("routers' CPU, all (us/event)", lambda t: f"{t.worker_cpu_us_per_event:.1f}"),
)
LATENCY_ROWS: tuple[tuple[str, LatencyCell], ...] = (
    ("latency: target rate (ev/s)", lambda lat: f"{lat.target_rate:,}"),
    ("  achieved rate x seconds", lambda lat: f"{lat.achieved_rate:,.0f} x {lat.seconds:.1f}"),
    ("  wait after producer (s)", lambda lat: f"{lat.wait_after_producer_s:g}"),
    ("  received / sent", lambda lat: f"{lat.received:,} / {lat.sent:,}"),
    ("  undelivered at deadline", lambda lat: f"{lat.missing_at_deadline:,}"),
    ("  p50 / p90 (ms)", lambda lat: f"{ms(lat.p50_ms)} / {ms(lat.p90_ms)}"),
    ("  p99 / max (ms)", lambda lat: f"{ms(lat.p99_ms)} / {ms(lat.max_ms)}"),
    ("  p99 min - max over runs (ms)", lambda lat: _latency_span(lat.runs_p99_ms)),
    (
        "  arrived only p50 / p99 (ms)",
        lambda lat: f"{ms(lat.arrived_p50_ms)} / {ms(lat.arrived_p99_ms)}",
    ),
    ("  drained after producer (s)", lambda lat: _num(lat.drained_after_producer_s, 2, "no")),
)
LABEL_WIDTH = 31
COLUMN_WIDTH = 24


def print_report(report: Report) -> None:
    env, config, t = report.environment, report.config, report.throughput
    print()
    print(
        f"eco-router benchmark: {env['cpus']} CPUs, Python {env['python']}, "
        f"redis-server {env['redis_server']}, {FAMILY.shards} shards; "
        f"{config['repeats']} interleaved drain round(s), {config['latency_repeats']} paced "
        "round(s); each figure is its column's median over the rounds"
    )
    if t:
        _print_order_section(report)
        _print_scaling_section(report)
        _print_batching_section(report)
        print("streams redis server time per event by command (INFO commandstats, us):")
        for drain in t.values():
            print(f"  {drain.router}: {_command_breakdown(drain.redis_usec_per_event_by_command)}")
    print_topology_section(4, report.topologies, label_width=LABEL_WIDTH, column_width=COLUMN_WIDTH)
    if report.rates:
        _print_rates_section(report)
    print(
        "goals of the router as the single writer, Redis only storing (this tree's worker, "
        "medians of this run):"
    )
    for line in goal_lines(report):
        print(f"  {line}")
    print("definitions:")
    for name, definition in report.definitions.items():
        print(f"  {name}: {definition}")


def _print_order_section(report: Report) -> None:
    baseline, r = report.baseline, report.ratios
    print()
    print("1. ONE ROUTER, WITH AND WITHOUT THE ORDER MECHANISM")
    if baseline["commit"] is None:
        print(f"   baseline columns skipped: {baseline['skipped']}")
    else:
        print(
            f"   baseline {baseline['commit']} ({baseline['subject']}): per-batch order check "
            f"off ({ORDER_WAIT_SETTING}=0) and on (its default)"
        )
    keys = ["leases", "baseline_no_check", "baseline_check"]
    _print_table(report, [k for k in keys if k in report.throughput], THROUGHPUT_ROWS)
    if "throughput_leases_over_no_check" in r:
        print(f"ORDER COST, one router, change vs {baseline['commit']} with its check off:")
        print(f"  leases (this tree):  {_changes(r, 'leases_over_no_check')}")
        if "throughput_check_over_no_check" in r:
            print(f"  {baseline['commit']} check on: {_changes(r, 'check_over_no_check')}")


def _print_scaling_section(report: Report) -> None:
    keys = ["leases"] + [
        k for k in report.throughput if k.startswith("leases_") and k.endswith("_routers")
    ]
    print()
    print("2. ROUTERS DRAINING ONE BACKLOG (this tree, shard leases)")
    first = report.throughput["leases"]
    print(
        f"   the same backlog ({first.events:,} events, {first.jobs:,} jobs) for every column; "
        "the 1-router column is section 1's leases column"
    )
    rows = (
        *SCALING_ROWS,
        ("throughput vs 1 router", lambda t: _scaled(report, t)),
    )
    _print_table(report, keys, rows, titles={"leases": "1 router"}, latency=False)


def _print_batching_section(report: Report) -> None:
    keys = [k for k in ("leases", "plain_batch", "naive", "read_count_1") if k in report.throughput]
    if len(keys) == 1:
        return
    r = report.ratios
    print()
    print("3. BATCHING: THE WORKER VS A NAIVE ONE-AT-A-TIME ROUTER")
    _print_table(report, keys, THROUGHPUT_ROWS, titles={"leases": "batched"})
    if "throughput_batched_over_naive" in r:
        print(
            f"HEADLINE batched / naive one-at-a-time: throughput "
            f"{r['throughput_batched_over_naive']:.2f}x; streams redis CPU per event "
            f"{r['redis_cpu_batched_over_naive']:.3f}x (naive spends "
            f"{r['redis_cpu_naive_over_batched']:.2f}x as much)"
        )
        print(
            f"  naive / batched CPU per event: pubsub redis "
            f"{r['pubsub_cpu_naive_over_batched']:.2f}x, router process "
            f"{r['worker_cpu_naive_over_batched']:.2f}x"
        )
    if "throughput_leases_over_plain" in r:
        print(f"VS PLAIN BATCH, this tree / plain batch: {_factors(r, 'leases_over_plain')}")
    if "throughput_baseline_over_plain" in r:
        print(f"  {report.baseline['commit']} / plain batch: {_factors(r, 'baseline_over_plain')}")
        print(f"  this tree / {report.baseline['commit']}: {_factors(r, 'leases_over_baseline')}")
    if "throughput_batched_over_read_count_1" in r:
        print(
            f"secondary, batched / worker READ_COUNT=1: throughput "
            f"{r['throughput_batched_over_read_count_1']:.2f}x; streams redis CPU per event "
            f"{r['redis_cpu_batched_over_read_count_1']:.3f}x (READ_COUNT=1 spends "
            f"{r['redis_cpu_read_count_1_over_batched']:.2f}x as much)"
        )
    print(
        "note: the baselines drain a smaller backlog and run a shorter paced run to bound the "
        "runtime; READ_COUNT=1 is per stream, so the worker still reads up to one entry per "
        "held shard per read and applies them in one script call"
    )


def _print_table(
    report: Report,
    keys: Sequence[str],
    rows: Sequence[tuple[str, Cell]],
    *,
    titles: dict[str, str] | None = None,
    latency: bool = True,
) -> None:
    def row(label: str, values: Sequence[str]) -> None:
        print(f"{label:<{LABEL_WIDTH}}" + "".join(f"{v:>{COLUMN_WIDTH}}" for v in values))

    drains = [report.throughput[k] for k in keys]
    row("", [(titles or {}).get(k, report.throughput[k].router) for k in keys])
    for label, cell in rows:
        row(label, [cell(t) for t in drains])
    if latency and all(k in report.latency for k in keys):
        for label, latency_cell in LATENCY_ROWS:
            row(label, [latency_cell(report.latency[k]) for k in keys])


# The latency yardstick: the highest paced rate with p99 within this.
P99_TARGET_MS = 10.0

RATE_ROWS: tuple[tuple[str, LatencyCell], ...] = (
    ("  achieved rate x seconds", lambda lat: f"{lat.achieved_rate:,.0f} x {lat.seconds:.1f}"),
    ("  received / sent", lambda lat: f"{lat.received:,} / {lat.sent:,}"),
    ("  p50 / p99 (ms)", lambda lat: f"{ms(lat.p50_ms)} / {ms(lat.p99_ms)}"),
    ("  p99 min - max over runs (ms)", lambda lat: _latency_span(lat.runs_p99_ms)),
    ("  router CPU (us/event)", lambda lat: f"{lat.router_cpu_us_per_event:.0f}"),
    ("  streams redis CPU (us/event)", lambda lat: f"{lat.redis_cpu_us_per_event:.1f}"),
    ("  pubsub redis CPU (us/event)", lambda lat: f"{lat.pubsub_cpu_us_per_event:.1f}"),
)


def _print_rates_section(report: Report) -> None:
    r = report.ratios
    print()
    rates = sorted(report.rates)
    print(f"5. PACED RATES: PER-BATCH COST AND LATENCY FROM {rates[0]:,} TO {rates[-1]:,} EV/S")
    print(
        "   CPU per event sent, from the producer's start to the drain (idle time included); "
        "latency as in the latency rows"
    )
    for rate, runs in report.rates.items():
        keys = list(runs)

        def row(label: str, values: Sequence[str]) -> None:
            print(f"{label:<{LABEL_WIDTH}}" + "".join(f"{v:>{COLUMN_WIDTH}}" for v in values))

        row(f"paced {rate:,} ev/s", [runs[k].router for k in keys])
        for label, cell in RATE_ROWS:
            row(label, [cell(runs[k]) for k in keys])
        for name, title in (
            ("leases_over_plain", "this tree / plain batch"),
            ("baseline_over_plain", f"{report.baseline['commit']} / plain batch"),
            ("leases_over_baseline", f"this tree / {report.baseline['commit']}"),
        ):
            key = f"paced_{rate}_router_cpu_{name}"
            if key not in r:
                continue
            p99 = r.get(f"paced_{rate}_p99_{name}")
            print(
                f"  {title}: router CPU/event {r[key]:.2f}x, streams redis CPU/event "
                f"{r[f'paced_{rate}_redis_cpu_{name}']:.2f}x, pubsub redis CPU/event "
                f"{r[f'paced_{rate}_pubsub_cpu_{name}']:.2f}x, p99 "
                + ("n/a" if p99 is None else f"{p99:.2f}x")
            )
        print("  streams redis server time per event by command (INFO commandstats, us):")
        for key in keys:
            usec = runs[key].redis_usec_per_event_by_command
            print(f"    {runs[key].router}: {_command_breakdown(usec)}")
    print(f"highest of these rates with every event delivered and p99 <= {P99_TARGET_MS:g} ms:")
    for key, name in _rate_columns(report):
        print(f"  {name}: {_highest_rate_within(report, key)}")


def _rate_columns(report: Report) -> list[tuple[str, str]]:
    """Each column of the paced runs: its key and its name."""
    columns: dict[str, str] = {}
    for runs in report.rates.values():
        columns.update({key: lat.router for key, lat in runs.items()})
    return list(columns.items())


def _highest_rate_within(report: Report, key: str) -> str:
    """The highest paced rate at which column `key` delivered every event with p99 within
    `P99_TARGET_MS`, provided it held at every lower rate too."""
    highest = "none"
    for rate in sorted(report.rates):
        lat = report.rates[rate].get(key)
        if lat is None or lat.received < lat.sent or lat.p99_ms is None:
            break
        if lat.p99_ms > P99_TARGET_MS:
            break
        highest = f"{rate:,} ev/s (p99 {lat.p99_ms:.1f} ms)"
    return highest


def _factors(ratios: dict[str, float], name: str) -> str:
    """Throughput, each CPU per event and the paced p99 as factors."""
    text = (
        f"throughput {ratios[f'throughput_{name}']:.2f}x, "
        f"streams redis CPU/event {ratios[f'redis_cpu_{name}']:.2f}x, "
        f"pubsub redis CPU/event {ratios[f'pubsub_cpu_{name}']:.2f}x, "
        f"router CPU/event {ratios[f'worker_cpu_{name}']:.2f}x"
    )
    p99 = ratios.get(f"p99_{name}")
    return text if p99 is None else f"{text}, paced p99 {p99:.2f}x"


def _scaled(report: Report, drain: Throughput) -> str:
    return f"{drain.events_per_s / report.throughput['leases'].events_per_s:.2f}x"


def _pct(ratio: float) -> str:
    """A ratio as a signed change: 0.95 -> "-5.0 %"."""
    return f"{(ratio - 1) * 100:+.1f} %"


def _changes(ratios: dict[str, float], name: str) -> str:
    """Throughput and CPU per event as signed changes, paced p99 as a factor."""
    text = (
        f"throughput {_pct(ratios[f'throughput_{name}'])}, "
        f"streams redis CPU/event {_pct(ratios[f'redis_cpu_{name}'])}, "
        f"router CPU/event {_pct(ratios[f'worker_cpu_{name}'])}"
    )
    p99 = ratios.get(f"p99_{name}")
    return text if p99 is None else f"{text}, paced p99 {p99:.2f}x"


def _command_breakdown(usec: dict[str, float]) -> str:
    """EVALSHA with the calls made inside it (commandstats counts those twice), then the rest."""
    inside = ", ".join(f"{c} {u}" for c, u in usec.items() if inside_scripts(c) and u)
    rest = [f"{c} {u}" for c, u in usec.items() if not inside_scripts(c) and c != "evalsha" and u]
    return f"evalsha {usec.get('evalsha', 0)} (inside: {inside}); " + ", ".join(rest)


def _span(values: Sequence[float], spec: str) -> str:
    return f"{spec.format(min(values))} - {spec.format(max(values))}" if values else "n/a"


def _latency_span(values: Sequence[float | None]) -> str:
    measured = [v for v in values if v is not None]
    if not values:
        return "n/a"
    low = ms(min(measured)) if measured else "n/a"
    high = ms(max(measured)) if len(measured) == len(values) else "inf"
    return f"{low} - {high}"


def _verdicts(verdicts: dict[str, int]) -> str:
    return "/".join(str(verdicts.get(v, 0)) for v in ("new", "duplicate", "stale", "invalid"))


def _num(value: float | None, digits: int, missing: str = "n/a") -> str:
    return missing if value is None else f"{value:.{digits}f}"


# --------------------------------------------------------------------------- options


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.router_bench", description=__doc__.split("\n")[0]
    )

    def sized(name: str, kind: type, text: str) -> None:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=None,
            help=f"{text} (default {FULL[name]:g}, --quick {QUICK[name]:g})",
        )

    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller backlogs, shorter paced runs, one round (about a minute)",
    )
    sized("events", int, "backlog size")
    sized("jobs", int, "jobs in the backlog")
    parser.add_argument("--rate", type=int, default=5_000, help="paced events/s (default 5000)")
    sized("seconds", float, "paced run length, s")
    sized("wait_after", float, "seconds to wait for delivery after the producer stops")
    sized("repeats", int, "interleaved drain rounds, the median run reported")
    sized("latency_repeats", int, "interleaved paced rounds, the median p99 reported; 0 skips")
    parser.add_argument(
        "--routers",
        type=_router_counts,
        default=(1, 2, 4),
        help="router counts of the scaling section, comma-separated (default 1,2,4)",
    )
    parser.add_argument(
        "--baseline-ref",
        default=DEFAULT_BASELINE_REF,
        help=(
            "the commit whose worker runs with its order check off and on "
            f"(default {DEFAULT_BASELINE_REF}); none skips those columns"
        ),
    )
    parser.add_argument(
        "--baseline-python",
        default=None,
        help="the interpreter of the baseline worker (default this one), e.g. another venv's",
    )
    parser.add_argument(
        "--skip-baseline", action="store_true", help="skip the naive and READ_COUNT=1 runs"
    )
    parser.add_argument(
        "--skip-read-count-1", action="store_true", help="skip the worker READ_COUNT=1 runs"
    )
    parser.add_argument(
        "--skip-plain-batch", action="store_true", help="skip the plain batch router's column"
    )
    parser.add_argument(
        "--baseline-default-only",
        action="store_true",
        help="one baseline column, the worker of --baseline-ref with its own defaults",
    )
    parser.add_argument(
        "--rates",
        type=_rates,
        default=(100, 1_000, 10_000, 20_000),
        help=(
            "paced rates of section 5, comma-separated ev/s (default 100,1000,10000,20000; 0 skips)"
        ),
    )
    sized("rates_seconds", float, "section 5: paced run length, s")
    sized("rates_repeats", int, "section 5: interleaved rounds, the median reported")
    sized("baseline_events", int, "naive and READ_COUNT=1 backlog")
    parser.add_argument("--baseline-rate", type=int, default=None, help="default: --rate")
    sized("baseline_seconds", float, "naive and READ_COUNT=1 paced run length, s")
    sized("baseline_wait_after", float, "naive and READ_COUNT=1: wait after the producer, s")
    parser.add_argument(
        "--only",
        choices=("topologies",),
        default=None,
        help="run one section alone: topologies (section 4)",
    )
    parser.add_argument(
        "--skip-topologies", action="store_true", help="skip section 4 (the topologies)"
    )
    sized("topology_events", int, "topologies' backlog")
    sized("topology_repeats", int, "interleaved topology rounds, the median run reported")
    parser.add_argument(
        "--topology-shards",
        type=int,
        default=FAMILY.shards,
        help=f"shards of the topologies' backlog and router (default {FAMILY.shards})",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.baseline_rate is None:
        args.baseline_rate = args.rate
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.only == "topologies" and args.skip_topologies:
        parser.error("--only topologies and --skip-topologies exclude each other")
    if args.topology_repeats < 1:
        parser.error("--topology-repeats must be at least 1")
    if args.topology_shards < 1:
        parser.error("--topology-shards must be at least 1")
    return args


def _rates(value: str) -> tuple[int, ...]:
    try:
        rates = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list") from error
    return tuple(rate for rate in rates if rate > 0)


def _router_counts(value: str) -> tuple[int, ...]:
    try:
        counts = sorted({int(part) for part in value.split(",") if part.strip()} | {1})
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list") from error
    if counts[0] < 1:
        raise argparse.ArgumentTypeError("router counts must be at least 1")
    return tuple(counts)


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(run, print_report, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
