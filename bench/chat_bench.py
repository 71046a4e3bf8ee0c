"""Chat benchmark: token streams from a worker's XADD to SSE viewers, through the real router
and gateway.

Run from the repository root: `.venv/bin/python -m bench.chat_bench [--quick]` (or
`make bench-chat`).

Every part starts its own throwaway redis-servers (streams, Pub/Sub) and this tree's
`eco-router worker` (the router) and `eco-router serve --no-router` (the gateway), one each,
both reading `--streams` (default `scan:events=4,chat:events=4`). Answers are written as the
reference chat worker writes them (`bench/chat_entries.py`) on the four `chat:events` shards;
viewers are raw-socket SSE clients on this process's uvloop (`bench/chat_viewer.py`) that
check every token by its content.

1. Throughput and latency: `--answers` answers at `--rate` tokens/s each for `--seconds`,
   one viewer each, connected before the answers start: tokens written and delivered,
   duplicates, missing, whole texts, latency from the writer's `ts` to the viewer's read.
2. Cost per token: the same token entries, as tokens (`stage=token`) and as stage events
   (`stage=delta`, the same fields otherwise), drained by one router from a hidden backlog
   (as `bench/router_bench.py` does); streams Redis and router CPU per token, and (a)/(b).
3. Resume: a viewer that saw the answer start reconnects with its Last-Event-ID after each of
   `--resume-tokens` tokens; what it gets before the first token written after it reconnected.
4. Fan-out: one answer at `--fanout-rate` tokens/s watched by `--viewers` viewers.

The report ends with the token goals (`bench/goals.py`): met, or missed by how much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import resource
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from bench.backlog import Workload, fill_hidden, group_state, open_gate
from bench.baseline_source import BaselineSource, baseline_source
from bench.chat_entries import (
    CHAT,
    DEFAULT_MAXLEN,
    AnswersWritten,
    EntryWriter,
    now_ts,
    opening_entries,
    token_entry,
    write_answers,
)
from bench.chat_viewer import AnswerLedger, ChatViewer, FrameParser, open_viewer, open_viewers
from bench.gateway_processes import free_port, gateway_fds, raise_fd_limit
from bench.goals import chat_goal_lines
from bench.producer_process import ProducerProcess
from bench.redis_probes import command_usec, redis_cpu_seconds, watch_drain
from bench.redis_servers import redis_servers
from bench.reporting import RESULTS_DIR, environment, num, percentile, run_benchmark, step
from bench.router_process import RouterProcess, eco_router_command, eco_router_env
from bench.routers import BATCHED_READ_COUNT, Worker, wait_until_reading
from bench.sse_client import Tally
from eco_router.testing import RedisServer

DOMAIN = CHAT.domain
DEFAULT_STREAMS = "scan:events=4,chat:events=4"
RESULTS_PATH = RESULTS_DIR / "chat.json"
PARTS = ("throughput", "cost", "resume", "fanout")
FD_HEADROOM = 200
SETTLE_S = 1.0
END_GRACE_S = 2.0
POLL_S = 0.02
LIVE_INTERVAL_S = 0.02  # a resumed answer goes on at 50 tokens/s
LIVE_TOKENS_CHECKED = 5
LAG_PROBE_S = 0.01
UNROUTED_PROBE_S = 0.2
RESUME_WAIT_S = 15.0
ROUTED_TIMEOUT_S = 120.0

# The gateway's counters a part reports (their /metrics names without `_total`).
GATEWAY_COUNTERS = {
    "event_router_gateway_events_sent": "sent",
    "event_router_gateway_events_dropped": "dropped (slow viewer)",
    "event_router_gateway_events_overtaken": "overtaken",
    "event_router_gateway_snapshots_sent": "snapshots",
    "event_router_gateway_feed_failures": "feed failures",
    "event_router_gateway_connections_closed": "closed",
}

FULL = {
    "answers": 1_000,
    "seconds": 10.0,
    "viewers": 1_000,
    # Few answers with many tokens in each batch, and many with about one each.
    "cost_shapes": "100x200,1000x20",
    "cost_repeats": 3,
    "resume_tokens": "10,1000,10000",
}
QUICK = {
    "answers": 100,
    "seconds": 3.0,
    "viewers": 100,
    "cost_shapes": "20x100,200x10",
    "cost_repeats": 1,
    "resume_tokens": "10,100,1000",
}


# --------------------------------------------------------------------------- processes


class Gateway(RouterProcess):
    """`eco-router serve --no-router` on a free loopback port, without per-client caps (every
    viewer comes from 127.0.0.1)."""

    clean_exits = (0, -signal.SIGTERM, -signal.SIGKILL)
    stop_timeout_s = 15.0

    def __init__(
        self,
        streams_url: str,
        pubsub_url: str,
        *,
        streams: str,
        connections: int,
        source: BaselineSource | None,
    ) -> None:
        self.port = free_port()
        env = eco_router_env(
            streams_url,
            pubsub_url,
            EVENT_ROUTER_STREAMS=streams,
            EVENT_ROUTER_LOG_LEVEL="WARNING",
            EVENT_ROUTER_GATEWAY_METRICS="true",
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS=str(connections),
            EVENT_ROUTER_SSE_MAX_PER_CLIENT="100000",
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT="0",
        )
        command = eco_router_command(
            "serve", "--no-router", "--host", "127.0.0.1", "--port", str(self.port)
        )
        if source is not None:
            env["PYTHONPATH"] = source.pythonpath()
            command = [source.python, "-m", "eco_router.entrypoints.cli", *command[1:]]
        fds = gateway_fds(connections)

        def limit_fds() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))

        super().__init__(command, env=env, name="gateway", preexec_fn=limit_fds)

    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def counters(self) -> dict[str, float]:
        """The gateway's counters from /metrics (`GATEWAY_COUNTERS`), by name and label."""
        text = self.http_get("/metrics", timeout=5)
        if text is None:
            return {}
        counters: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name not in GATEWAY_COUNTERS:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    label = ",".join(sample.labels.values())
                    name = GATEWAY_COUNTERS[family.name] + (f" {label}" if label else "")
                    counters[name] = counters.get(name, 0.0) + sample.value
        return counters


@dataclass(slots=True)
class Stack:
    """The servers and processes of one part."""

    streams: RedisServer
    pubsub: RedisServer
    router: Worker
    gateway: Gateway | None
    streams_client: redis.Redis
    pubsub_client: redis.Redis


def start_router(
    streams: RedisServer, pubsub: RedisServer, args: argparse.Namespace, name: str
) -> Worker:
    return Worker(
        streams.url,
        pubsub.url,
        read_count=BATCHED_READ_COUNT,
        name=name,
        source=args.source,
        settings={"EVENT_ROUTER_STREAMS": args.streams},
    )


@contextmanager
def part_stack(args: argparse.Namespace, name: str, *, connections: int) -> Iterator[Stack]:
    """Fresh servers, the router and the gateway, all ready; everything removed afterwards."""
    with ExitStack() as stack:
        streams, pubsub = stack.enter_context(redis_servers())
        router = stack.enter_context(start_router(streams, pubsub, args, f"chat-{name}"))
        gateway = stack.enter_context(
            Gateway(
                streams.url,
                pubsub.url,
                streams=args.streams,
                connections=connections + FD_HEADROOM,
                source=args.source,
            )
        )
        router.wait_ready()
        gateway.wait_ready()
        streams_client = stack.enter_context(redis.Redis.from_url(streams.url))
        pubsub_client = stack.enter_context(redis.Redis.from_url(pubsub.url))
        yield Stack(streams, pubsub, router, gateway, streams_client, pubsub_client)


@dataclass(frozen=True, slots=True)
class CpuMark:
    """CPU seconds of every process of a part, and the wall clock, at one moment."""

    at: float
    router: float
    gateway: float
    streams: float
    pubsub: float
    bench: float

    @classmethod
    def take(cls, s: Stack) -> CpuMark:
        return cls(
            at=time.monotonic(),
            router=s.router.cpu_seconds(),
            gateway=s.gateway.cpu_seconds() if s.gateway is not None else 0.0,
            streams=redis_cpu_seconds(s.streams_client),
            pubsub=redis_cpu_seconds(s.pubsub_client),
            bench=time.process_time(),
        )

    def until(self, later: CpuMark) -> dict[str, float]:
        """Seconds of CPU each spent from this mark to `later`, and `wall`."""
        return {
            "wall": later.at - self.at,
            "router": later.router - self.router,
            "gateway": later.gateway - self.gateway,
            "streams": later.streams - self.streams,
            "pubsub": later.pubsub - self.pubsub,
            "bench": later.bench - self.bench,
        }


# --------------------------------------------------------------------------- figures


def ranked(latencies: Sequence[float], expected: int) -> list[float]:
    # Tokens never delivered rank as infinitely late, not as absent.
    values = sorted(latencies)
    return values + [math.inf] * max(0, expected - len(values))


def per_unit_us(seconds: float, units: int) -> float | None:
    return round(1e6 * seconds / units, 2) if units else None


def share_of_core(seconds: float, wall: float) -> float:
    return round(100 * seconds / wall, 1) if wall > 0 else 0.0


@dataclass(slots=True)
class Delivery:
    """What the viewers of one or more answers received, against what was written."""

    viewers: int = 0
    established: int = 0
    connect_failures: dict[str, int] = field(default_factory=dict)
    tokens_written: int = 0
    write_rate: float = 0.0
    write_seconds: float = 0.0
    writer_cpu_percent: float = 0.0
    tokens_expected: int = 0  # summed over viewers
    tokens_delivered: int = 0  # distinct tokens received one by one, over viewers
    tokens_recovered: int = 0  # held only through a token_recovery frame
    duplicates: int = 0
    missing: int = 0
    viewers_exact: int = 0  # every token exactly once, the text whole and in order
    streams_ended_done: int = 0
    text_checks: int = 0
    text_checks_matching: int = 0
    repeated_ids: int = 0
    ids_backwards: int = 0
    prev_mismatches: int = 0
    snapshots: int = 0
    recoveries: int = 0
    stage_frames: dict[str, int] = field(default_factory=dict)
    token_frame_bytes: int | None = None
    sample_token_frame: str | None = None
    errors: dict[str, int] = field(default_factory=dict)
    problems: dict[str, int] = field(default_factory=dict)
    cut: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    delivered_within_s: float | None = None
    first_viewer_p50_ms: float | None = None
    first_viewer_p99_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    unrouted_at_end: int | None = None  # chat entries lagging or pending when measured
    unrouted_max: int | None = None  # the most of them seen while the answers were written
    gateway_counters: dict[str, int] = field(default_factory=dict)
    loop_lag_max_ms: float | None = None
    cpu_percent: dict[str, float] = field(default_factory=dict)
    router_us_per_token: float | None = None
    streams_us_per_token: float | None = None
    pubsub_us_per_token: float | None = None
    gateway_us_per_frame: float | None = None


def tally_delivery(
    d: Delivery,
    ledgers: Sequence[AnswerLedger],
    written: AnswersWritten,
    expected_of: Callable[[int], int],
    tally: Tally,
) -> None:
    """Fill `d` from the viewers' ledgers; viewer `i` expects `expected_of(i)` tokens."""
    latencies: list[float] = []
    stage_frames: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    d.tokens_written = written.tokens
    d.write_rate = round(written.rate, 1)
    d.write_seconds = round(written.seconds, 2)
    d.writer_cpu_percent = share_of_core(written.cpu_s, written.seconds)
    for i, ledger in enumerate(ledgers):
        expected = expected_of(i)
        d.tokens_expected += expected
        d.tokens_delivered += len(ledger.tokens)
        d.tokens_recovered += ledger.held() - len(ledger.tokens)
        d.duplicates += ledger.duplicates
        missing = ledger.missing(expected)
        d.missing += missing
        exact = ledger.duplicates == 0 and missing == 0 and ledger.text_matches(expected)
        d.viewers_exact += exact
        d.streams_ended_done += ledger.ended_with == "done"
        check = ledger.text_check_matches()
        if check is not None:
            d.text_checks += 1
            d.text_checks_matching += check
        d.repeated_ids += ledger.repeated_ids
        d.ids_backwards += ledger.ids_backwards
        d.prev_mismatches += ledger.prev_mismatches
        d.snapshots += ledger.snapshots
        d.recoveries += ledger.recoveries
        stage_frames.update(ledger.stage_frames)
        errors.update(ledger.errors)
        latencies += ledger.latencies_ms
    d.stage_frames, d.errors = dict(stage_frames), dict(errors)
    token_frames = sum(ledger.token_frames for ledger in ledgers)
    if token_frames:
        d.token_frame_bytes = round(sum(ledger.token_bytes for ledger in ledgers) / token_frames)
    sample = next((ledger.sample_token for ledger in ledgers if ledger.sample_token), None)
    d.sample_token_frame = None if sample is None else sample.decode(errors="replace")
    d.problems, d.cut = dict(tally.problems), tally.cut
    ordered = ranked(latencies, d.tokens_expected)
    d.p50_ms, d.p99_ms, d.max_ms = (percentile(ordered, p) for p in (50, 99, 100))


def fill_cpu(d: Delivery, cpu: dict[str, float], frames: int) -> None:
    wall = cpu["wall"]
    d.cpu_percent = {
        name: share_of_core(cpu[name], wall)
        for name in ("router", "gateway", "streams", "pubsub", "bench")
    }
    d.router_us_per_token = per_unit_us(cpu["router"], d.tokens_written)
    d.streams_us_per_token = per_unit_us(cpu["streams"], d.tokens_written)
    d.pubsub_us_per_token = per_unit_us(cpu["pubsub"], d.tokens_written)
    d.gateway_us_per_frame = per_unit_us(cpu["gateway"], frames)


async def deliver(
    s: Stack,
    args: argparse.Namespace,
    job_ids: Sequence[str],
    viewers_of: Sequence[int],
    rate: int,
    *,
    shared_frames: bool,
) -> Delivery:
    """`viewers_of[j]` viewers of answer `job_ids[j]`, connected before the answers start;
    then the answers, `rate` tokens/s each, from a writer process; then the wait for every
    token. CPU is measured from the writer's start until every token arrived (or the wait
    ran out)."""
    assert s.gateway is not None
    d = Delivery()
    ledgers = [
        AnswerLedger(job)
        for job, count in zip(job_ids, viewers_of, strict=True)
        for _ in range(count)
    ]
    answer_of = [j for j, count in enumerate(viewers_of) for _ in range(count)]
    tally, parser = Tally(), FrameParser(shared=shared_frames)
    step("connect", f"{len(ledgers):,} viewers of {len(job_ids):,} answers")
    viewers, failures = await open_viewers(s.gateway.port, DOMAIN, ledgers, tally, parser)
    d.viewers, d.established, d.connect_failures = len(ledgers), len(viewers), dict(failures)
    await asyncio.sleep(SETTLE_S)
    step("write", f"{len(job_ids):,} answers at {rate} tokens/s each for {args.seconds:g} s")
    lags: list[float] = []
    waiting: list[int] = []
    probes = [
        asyncio.create_task(measure_loop_lag(lags)),
        asyncio.create_task(measure_unrouted(s.streams_client, waiting)),
    ]
    before = CpuMark.take(s)
    with ProducerProcess(
        write_answers,
        s.streams.url,
        job_ids,
        rate,
        args.seconds,
        args.maxlen,
        name="chat-bench-writer",
    ) as producer:
        written: AnswersWritten = await producer.figures_async(2 * args.seconds + 60, poll_s=0.05)
    written_at = time.monotonic()
    for ledger, answer in zip(ledgers, answer_of, strict=True):
        ledger.expect(written.tokens_of(answer))
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(args.wait_after):
            await asyncio.gather(*(ledger.complete.wait() for ledger in ledgers))
    after = CpuMark.take(s)
    for probe in probes:
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe
    d.unrouted_max = max(waiting, default=None)
    ordered_lags = sorted(lags)
    d.loop_lag_p99_ms, d.loop_lag_max_ms = (percentile(ordered_lags, p) for p in (99, 100))
    state = group_state(s.streams_client, CHAT)
    d.unrouted_at_end = state.lag + state.pending
    if all(ledger.complete.is_set() for ledger in ledgers):
        d.delivered_within_s = round(after.at - written_at, 2)
    # The terminal events follow the last tokens: a short wait for them, not measured.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(END_GRACE_S):
            await asyncio.gather(*(ledger.ended.wait() for ledger in ledgers))
    d.gateway_counters = {k: int(v) for k, v in s.gateway.counters().items() if v}
    for viewer in viewers:
        viewer.close()
    tally_delivery(d, ledgers, written, lambda i: written.tokens_of(answer_of[i]), tally)
    if len(ledgers) > len(job_ids):
        d.first_viewer_p50_ms, d.first_viewer_p99_ms = first_viewer_latency(ledgers, answer_of)
    fill_cpu(d, before.until(after), sum(ledger.frames for ledger in ledgers))
    return d


async def measure_loop_lag(lags: list[float]) -> None:
    """How late this process's loop wakes for a timer: how long a frame may wait in it
    before its viewer reads it (and its latency is taken)."""
    while True:
        due = time.monotonic() + LAG_PROBE_S
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(1000 * max(0.0, time.monotonic() - due))


async def measure_unrouted(client: redis.Redis, waiting: list[int]) -> None:
    """How many chat entries wait for the router (lag + pending), every `UNROUTED_PROBE_S`."""
    while True:
        state = group_state(client, CHAT)
        waiting.append(state.lag + state.pending)
        await asyncio.sleep(UNROUTED_PROBE_S)


def first_viewer_latency(
    ledgers: Sequence[AnswerLedger], answer_of: Sequence[int]
) -> tuple[float | None, float | None]:
    """p50 and p99 over tokens of the latency of the first viewer to get each: the path up to
    the gateway's first write, without the spread over the viewers."""
    first: dict[tuple[int, int], float] = {}
    for ledger, answer in zip(ledgers, answer_of, strict=True):
        for token, latency in ledger.latency_of.items():
            key = (answer, token)
            if latency < first.get(key, math.inf):
                first[key] = latency
    ordered = sorted(first.values())
    return percentile(ordered, 50), percentile(ordered, 99)


def throughput(args: argparse.Namespace) -> Delivery:
    print("== 1. throughput and latency", flush=True)
    with part_stack(args, "throughput", connections=args.answers) as s:
        run_id = f"{time.time_ns():x}"
        jobs = [f"chat-{run_id}-{n:05d}" for n in range(args.answers)]
        return uvloop.run(deliver(s, args, jobs, [1] * len(jobs), args.rate, shared_frames=False))


def fan_out(args: argparse.Namespace) -> Delivery:
    print("== 4. fan-out", flush=True)
    with part_stack(args, "fanout", connections=args.viewers) as s:
        job = f"chat-fan-{time.time_ns():x}"
        return uvloop.run(
            deliver(s, args, [job], [args.viewers], args.fanout_rate, shared_frames=True)
        )


# --------------------------------------------------------------------------- 2. cost


@dataclass(slots=True)
class CostSample:
    """One drain of the token backlog, fed as one kind."""

    kind: str
    tokens: int
    drain_s: float
    streams_us: float
    router_us: float
    pubsub_us: float
    verdicts: dict[str, float]
    # The streams server's time per token by command (INFO commandstats over the drain).
    command_us: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Cost:
    """Both kinds side by side, medians over the rounds."""

    answers: int
    tokens_per_answer: int
    rounds: int
    samples: list[CostSample] = field(default_factory=list)
    median: dict[str, dict[str, float]] = field(default_factory=dict)
    ratio: dict[str, float | None] = field(default_factory=dict)
    command_us: dict[str, dict[str, float]] = field(default_factory=dict)


# What the bench itself sends during a drain.
BENCH_COMMANDS = frozenset({"config|resetstat", "info", "xinfo|groups", "multi", "exec"})
COST_KINDS = {"token": "(a) stage=token", "delta": "(b) stage=delta"}
COST_FIGURES = ("streams_us", "router_us", "pubsub_us", "tokens_per_s")


def cost_entries(kind: str, answers: int, tokens: int) -> list[tuple[str, dict[str, str]]]:
    """`tokens` tokens of each of `answers` answers, interleaved round-robin, as `kind`."""
    run_id = f"{time.time_ns():x}"
    jobs = [f"cost-{run_id}-{n:04d}" for n in range(answers)]
    ts = now_ts()
    return [token_entry(job, n, ts, stage=kind) for n in range(1, tokens + 1) for job in jobs]


def cost_sample(kind: str, answers: int, tokens: int, args: argparse.Namespace) -> CostSample:
    entries = cost_entries(kind, answers, tokens)
    with ExitStack() as stack:
        streams, pubsub = stack.enter_context(redis_servers())
        client = stack.enter_context(redis.Redis.from_url(streams.url))
        pubsub_client = stack.enter_context(redis.Redis.from_url(pubsub.url))
        backlog = fill_hidden(client, Workload(entries, answers, 0, 0), CHAT)
        with start_router(streams, pubsub, args, f"chat-cost-{kind}") as router:
            wait_until_reading(client, [router], family=CHAT)
            streams_cpu, pubsub_cpu = redis_cpu_seconds(client), redis_cpu_seconds(pubsub_client)
            router_cpu = router.cpu_seconds()
            client.config_resetstat()
            opened = open_gate(client, backlog, CHAT)
            drained = watch_drain(client, [router], len(entries), CHAT)
            commands = command_usec(client)
            streams_cpu = redis_cpu_seconds(client) - streams_cpu
            pubsub_cpu = redis_cpu_seconds(pubsub_client) - pubsub_cpu
            router_cpu = router.cpu_seconds() - router_cpu
        count = len(entries)
        return CostSample(
            kind=kind,
            tokens=count,
            drain_s=round(drained - opened, 3),
            streams_us=round(1e6 * streams_cpu / count, 2),
            router_us=round(1e6 * router_cpu / count, 2),
            pubsub_us=round(1e6 * pubsub_cpu / count, 2),
            verdicts=router.figures,
            command_us={
                name: round(usec / count, 2)
                for name, usec in commands.items()
                if name not in BENCH_COMMANDS
            },
        )


def cost(args: argparse.Namespace) -> list[Cost]:
    print("== 2. cost per token", flush=True)
    return [cost_of_shape(answers, tokens, args) for answers, tokens in args.cost_shapes]


def cost_of_shape(answers: int, tokens: int, args: argparse.Namespace) -> Cost:
    result = Cost(answers, tokens, args.cost_repeats)
    kinds = list(COST_KINDS)
    for round_ in range(args.cost_repeats):
        # a, b, b, a, ...: a machine slowing down slows both alike.
        for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
            step("cost", f"round {round_ + 1}: {answers:,} answers x {tokens:,} tokens as {kind}")
            result.samples.append(cost_sample(kind, answers, tokens, args))
    for kind in kinds:
        samples = [s for s in result.samples if s.kind == kind]
        result.median[kind] = {
            "streams_us": statistics.median(s.streams_us for s in samples),
            "router_us": statistics.median(s.router_us for s in samples),
            "pubsub_us": statistics.median(s.pubsub_us for s in samples),
            "tokens_per_s": statistics.median(s.tokens / s.drain_s for s in samples),
        }
        names = {name for s in samples for name in s.command_us}
        result.command_us[kind] = {
            name: statistics.median(s.command_us.get(name, 0.0) for s in samples)
            for name in sorted(names)
        }
    a, b = result.median["token"], result.median["delta"]
    for name in COST_FIGURES:
        result.ratio[name] = round(a[name] / b[name], 3) if b[name] else None
    both_b = b["streams_us"] + b["router_us"]
    result.ratio["streams_plus_router"] = (
        round((a["streams_us"] + a["router_us"]) / both_b, 3) if both_b else None
    )
    return result


# --------------------------------------------------------------------------- 3. resume


@dataclass(slots=True)
class Resume:
    """One viewer resuming after `missed` tokens."""

    missed: int
    last_event_id: int | None = None
    frames_before_live: int | None = None
    frames_by_kind: dict[str, int] = field(default_factory=dict)
    bytes_before_live: int | None = None
    first_frame_ms: float | None = None
    first_live_ms: float | None = None
    text_correct: bool | None = None
    duplicates: int = 0
    tokens_missing: int | None = None
    problem: str | None = None


async def wait_for(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def wait_routed(client: redis.Redis, timeout_s: float = ROUTED_TIMEOUT_S) -> bool:
    """Until the router has acked every chat entry (none lagging or pending)."""
    return await wait_for(lambda: group_state(client, CHAT).drained, timeout_s)


async def resume_after(s: Stack, writer: EntryWriter, missed: int) -> Resume:
    assert s.gateway is not None
    r = Resume(missed)
    job = f"chat-resume-{missed}-{time.time_ns():x}"
    tally, parser = Tally(), FrameParser()
    # The viewer sees the answer start, then loses its connection.
    writer.write(opening_entries(job))
    first = AnswerLedger(job)
    viewer: ChatViewer = await open_viewer(s.gateway.port, DOMAIN, first, tally, parser)
    seen_start = await wait_for(lambda: first.stage_frames["answer"] >= 1, RESUME_WAIT_S)
    viewer.close()
    if not seen_start:
        r.problem = f"the answer's start never arrived: {dict(first.stage_frames)}"
        return r
    r.last_event_id = first.last_id
    writer.write([token_entry(job, n, now_ts()) for n in range(1, missed + 1)])
    if not await wait_routed(s.streams_client):
        r.problem = "the missed tokens were not routed in time"
        return r
    ledger = AnswerLedger(job, live_after=missed)
    resumed = await open_viewer(
        s.gateway.port, DOMAIN, ledger, tally, parser, last_event_id=first.last_id
    )
    live = asyncio.create_task(write_live(writer, job, missed))
    try:
        # A few live tokens after the first: the text is then checked against them.
        await wait_for(
            lambda: (
                ledger.first_live_s is not None
                and len([n for n in ledger.tokens if n > missed]) >= LIVE_TOKENS_CHECKED
            ),
            RESUME_WAIT_S,
        )
    finally:
        live.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await live
        resumed.close()
    if ledger.first_live_s is None:
        r.problem = f"no live token within {RESUME_WAIT_S:g} s"
    r.frames_before_live = ledger.frames_before_live
    r.frames_by_kind = dict(ledger.kinds_before_live)
    r.bytes_before_live = ledger.bytes_before_live
    r.first_frame_ms = (
        None if ledger.first_frame_s is None else round(1000 * ledger.first_frame_s, 1)
    )
    r.first_live_ms = None if ledger.first_live_s is None else round(1000 * ledger.first_live_s, 1)
    highest = max(ledger.tokens, default=ledger.recovered_through)
    r.text_correct = ledger.text_matches(highest)
    r.duplicates = ledger.duplicates
    r.tokens_missing = ledger.missing(highest)
    return r


async def write_live(writer: EntryWriter, job: str, after: int) -> None:
    n = after
    while True:
        n += 1
        writer.write([token_entry(job, n, now_ts())])
        await asyncio.sleep(LIVE_INTERVAL_S)


def resume(args: argparse.Namespace) -> list[Resume]:
    print("== 3. resume", flush=True)
    results = []
    with (
        part_stack(args, "resume", connections=10) as s,
        EntryWriter(s.streams.url, maxlen=args.maxlen) as writer,
    ):
        for missed in args.resume_tokens:
            step("resume", f"after {missed:,} tokens")
            results.append(uvloop.run(resume_after(s, writer, missed)))
    return results


# --------------------------------------------------------------------------- the report


@dataclass(slots=True)
class Report:
    args: dict[str, Any]
    source: str
    throughput: Delivery | None = None
    cost: list[Cost] = field(default_factory=list)
    resume: list[Resume] = field(default_factory=list)
    fanout: Delivery | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    # The machine's 1-minute load average at the start and at the end: other work on it
    # takes CPU from the processes measured.
    load: list[float] = field(default_factory=list)


def run(args: argparse.Namespace) -> Report:
    raise_fd_limit(gateway_fds(max(args.answers, args.viewers) + FD_HEADROOM))
    with ExitStack() as stack:
        args.source = None
        title = "this tree (working copy)"
        if args.ref:
            args.source = stack.enter_context(baseline_source(args.ref))
            subject = args.source.subject
            title = f"{args.source.commit} ({subject[:70]}{'...' if len(subject) > 70 else ''})"
        report = Report({k: str(v) for k, v in vars(args).items()}, title)
        report.load.append(os.getloadavg()[0])
        if "throughput" in args.only:
            report.throughput = throughput(args)
        if "cost" in args.only:
            report.cost = cost(args)
        if "resume" in args.only:
            report.resume = resume(args)
        if "fanout" in args.only:
            report.fanout = fan_out(args)
    report.environment = environment()
    report.load.append(os.getloadavg()[0])
    return report


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def delivery_rows(d: Delivery, *, per_answer: str) -> list[list[str]]:
    frames = sum(d.stage_frames.values())
    first_viewer = []
    if d.first_viewer_p50_ms is not None:
        first_viewer = [
            [
                "first viewer of each token: latency p50 / p99 (ms)",
                f"{num(d.first_viewer_p50_ms)} / {num(d.first_viewer_p99_ms)}",
            ]
        ]
    return [
        ["viewers established", f"{d.established:,} / {d.viewers:,}"],
        [
            "tokens written (tokens/s)",
            f"{d.tokens_written:,} ({d.write_rate:,.0f}/s over {d.write_seconds:g} s)",
        ],
        [f"tokens expected ({per_answer})", f"{d.tokens_expected:,}"],
        ["tokens delivered", f"{d.tokens_delivered:,}"],
        ["tokens held through a token_recovery", f"{d.tokens_recovered:,}"],
        ["duplicates", f"{d.duplicates:,}"],
        ["missing", f"{d.missing:,}"],
        [
            "viewers with every token once, text whole and in order",
            f"{d.viewers_exact:,} / {d.viewers:,}",
        ],
        ["all delivered within (s of the last write)", num(d.delivered_within_s, "{:.2f}")],
        ["latency p50 / p99 / max (ms)", f"{num(d.p50_ms)} / {num(d.p99_ms)} / {num(d.max_ms)}"],
        *first_viewer,
        ["streams ended with done", f"{d.streams_ended_done:,} / {d.viewers:,}"],
        [
            "text_check on the end matches the text",
            f"{d.text_checks_matching:,} / {d.text_checks:,}",
        ],
        [
            "ids repeated / backwards / prev_event_id mismatches",
            f"{d.repeated_ids} / {d.ids_backwards} / {d.prev_mismatches}",
        ],
        ["bytes per token frame (mean)", num(d.token_frame_bytes, "{:,}")],
        ["snapshots / token_recovery frames", f"{d.snapshots:,} / {d.recoveries:,}"],
        [
            f"other frames ({frames:,})",
            ", ".join(f"{k} {v:,}" for k, v in sorted(d.stage_frames.items())) or "-",
        ],
        [
            "router CPU: % of a core, µs per token",
            f"{num(d.cpu_percent.get('router'), '{:.0f}')} %, {num(d.router_us_per_token)}",
        ],
        [
            "streams Redis CPU: % of a core, µs per token",
            f"{num(d.cpu_percent.get('streams'), '{:.0f}')} %, {num(d.streams_us_per_token)}",
        ],
        [
            "Pub/Sub Redis CPU: % of a core, µs per token",
            f"{num(d.cpu_percent.get('pubsub'), '{:.0f}')} %, {num(d.pubsub_us_per_token)}",
        ],
        [
            "gateway CPU: % of a core, µs per frame",
            f"{num(d.cpu_percent.get('gateway'), '{:.0f}')} %, {num(d.gateway_us_per_frame)}",
        ],
        [
            "chat entries waiting for the router: most seen / at the end",
            f"{num(d.unrouted_max, '{:,}')} / {num(d.unrouted_at_end, '{:,}')}",
        ],
        [
            "gateway counters",
            ", ".join(f"{k} {v:,}" for k, v in sorted(d.gateway_counters.items())) or "n/a",
        ],
        ["this bench's viewers: % of a core", f"{num(d.cpu_percent.get('bench'), '{:.0f}')} %"],
        [
            "this bench's loop lag p99 / max (ms)",
            f"{num(d.loop_lag_p99_ms)} / {num(d.loop_lag_max_ms)}",
        ],
        ["this bench's writer: % of a core", f"{d.writer_cpu_percent:.0f} %"],
    ]


def print_delivery_notes(d: Delivery) -> None:
    if d.sample_token_frame:
        print("a token frame as received:")
        print("```")
        print(d.sample_token_frame)
        print("```")
    for name, value in (
        ("connect failures", d.connect_failures),
        ("error frames", d.errors),
        ("unparsed frames", d.problems),
    ):
        if value:
            print(f"{name}: {value}")
    if d.cut:
        print(f"streams cut by the gateway: {d.cut}")


def print_report(report: Report) -> None:
    env = report.environment
    args = report.args
    print()
    print(
        f"eco-router chat benchmark: {env['cpus']} CPUs, Python {env['python']}, "
        f"{report.source}, EVENT_ROUTER_STREAMS={args['streams']}; load average at the start "
        f"and end {' and '.join(f'{x:.2f}' for x in report.load)}"
    )
    print()
    if (d := report.throughput) is not None:
        print(
            f"### 1. Throughput and latency: {args['answers']} answers x {args['rate']} tokens/s, "
            f"{args['seconds']} s, one viewer each"
        )
        print()
        table(["", "value"], delivery_rows(d, per_answer="over the viewers"))
        print_delivery_notes(d)
    for c in report.cost:
        print(
            f"### 2. Cost per token: {c.answers} answers x {c.tokens_per_answer} tokens "
            f"({c.answers * c.tokens_per_answer:,} entries) drained by one router, median of "
            f"{c.rounds} round(s)"
        )
        print()
        a, b = c.median["token"], c.median["delta"]
        labels = {
            "streams_us": "streams Redis CPU (µs/token)",
            "router_us": "router CPU (µs/token)",
            "pubsub_us": "Pub/Sub Redis CPU (µs/token)",
            "tokens_per_s": "tokens/s drained",
        }
        rows = [
            [
                labels[name],
                num(a[name], "{:,.2f}"),
                num(b[name], "{:,.2f}"),
                num(c.ratio[name], "{:.3f}"),
            ]
            for name in COST_FIGURES
        ]
        rows.append(
            [
                "streams Redis + router (µs/token)",
                num(a["streams_us"] + a["router_us"], "{:,.2f}"),
                num(b["streams_us"] + b["router_us"], "{:,.2f}"),
                num(c.ratio["streams_plus_router"], "{:.3f}"),
            ]
        )
        verdict_cells = []
        for kind in COST_KINDS:
            totals: Counter[str] = Counter()
            for sample in c.samples:
                if sample.kind == kind:
                    totals.update({k: int(v) for k, v in sample.verdicts.items() if k in VERDICTS})
            verdict_cells.append(
                ", ".join(f"{k} {v:,}" for k, v in sorted(totals.items())) or "n/a"
            )
        rows.append(["router verdicts (all rounds)", *verdict_cells, ""])
        batches = []
        for kind in COST_KINDS:
            sums = [x.verdicts.get("batch_size_sum", 0.0) for x in c.samples if x.kind == kind]
            counts = [x.verdicts.get("batch_size_count", 0.0) for x in c.samples if x.kind == kind]
            batches.append(num(sum(sums) / sum(counts), "{:.1f}") if sum(counts) else "n/a")
        rows.append(["router's mean batch (entries per read)", *batches, ""])
        a_cmd, b_cmd = c.command_us.get("token", {}), c.command_us.get("delta", {})
        for name in sorted(set(a_cmd) | set(b_cmd), key=lambda n: -b_cmd.get(n, a_cmd.get(n, 0))):
            x, y = a_cmd.get(name, 0.0), b_cmd.get(name, 0.0)
            if max(x, y) >= 0.05:
                factor = f"{x / y:.3f}" if y else "n/a"
                rows.append([f"  streams Redis {name} (µs/token)", f"{x:.2f}", f"{y:.2f}", factor])
        table(["", COST_KINDS["token"], COST_KINDS["delta"], "(a)/(b)"], rows)
        print(
            "(the rows by command are INFO commandstats: time inside each command, a script's "
            "with the commands it calls; a busy machine inflates them, not the CPU rows)"
        )
        print()
    if report.resume:
        print("### 3. Resume: one viewer reconnecting with Last-Event-ID after N tokens")
        print()
        cols = report.resume
        rows = [
            ["Last-Event-ID sent", *(num(r.last_event_id, "{}") for r in cols)],
            [
                "frames before the first live frame",
                *(num(r.frames_before_live, "{:,}") for r in cols),
            ],
            [
                "  of which",
                *(
                    ", ".join(f"{k} {v:,}" for k, v in r.frames_by_kind.items()) or "-"
                    for r in cols
                ),
            ],
            [
                "bytes before the first live frame",
                *(num(r.bytes_before_live, "{:,}") for r in cols),
            ],
            ["time to first frame (ms)", *(num(r.first_frame_ms) for r in cols)],
            ["time to first live frame (ms)", *(num(r.first_live_ms) for r in cols)],
            [
                "text whole and in order after the live tokens",
                *(
                    "n/a" if r.text_correct is None else ("yes" if r.text_correct else "NO")
                    for r in cols
                ),
            ],
            [
                "tokens missing / duplicates",
                *(f"{num(r.tokens_missing, '{:,}')} / {r.duplicates}" for r in cols),
            ],
        ]
        table(["", *(f"after {r.missed:,}" for r in cols)], rows)
        for r in cols:
            if r.problem:
                print(f"after {r.missed:,}: {r.problem}")
    if (d := report.fanout) is not None:
        print(
            f"### 4. Fan-out: one answer at {args['fanout_rate']} tokens/s for "
            f"{args['seconds']} s, {args['viewers']} viewers"
        )
        print()
        table(["", "value"], delivery_rows(d, per_answer="over the viewers"))
        print_delivery_notes(d)
    if report.throughput is not None or report.cost:
        print("### Goals of tokens (this tree's router; section 2's medians, section 1's run)")
        print()
        for line in chat_goal_lines(report):
            print(f"  - {line.strip()}" if line.startswith("  ") else f"- {line}")
        print()


VERDICTS = frozenset({"new", "duplicate", "stale", "invalid", "text_full"})


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chat_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one cost round")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--answers", type=int, help="concurrent answers of part 1 (1000)")
    parser.add_argument("--rate", type=int, default=30, help="tokens/s per answer (30)")
    parser.add_argument("--seconds", type=float, help="writing time of parts 1 and 4 (10)")
    parser.add_argument(
        "--wait-after", type=float, default=10.0, help="wait for the last tokens (10 s)"
    )
    parser.add_argument(
        "--cost-shapes", help="part 2's backlogs, answers x tokens each (100x200,1000x20)"
    )
    parser.add_argument("--cost-repeats", type=int, help="rounds of part 2 (3)")
    parser.add_argument("--resume-tokens", help="tokens missed before each resume (10,1000,10000)")
    parser.add_argument("--viewers", type=int, help="viewers of part 4's answer (1000)")
    parser.add_argument("--fanout-rate", type=int, default=50, help="part 4 tokens/s (50)")
    parser.add_argument(
        "--streams", default=DEFAULT_STREAMS, help=f"EVENT_ROUTER_STREAMS ({DEFAULT_STREAMS})"
    )
    parser.add_argument(
        "--maxlen", type=int, default=DEFAULT_MAXLEN, help="XADD MAXLEN ~ per shard"
    )
    parser.add_argument(
        "--ref",
        default=None,
        help="run the router and gateway from this commit's src/ (default: the working copy)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.resume_tokens = [int(n) for n in str(args.resume_tokens).split(",") if n]
    try:
        args.cost_shapes = [
            (int(a), int(t))
            for a, t in (shape.split("x") for shape in str(args.cost_shapes).split(",") if shape)
        ]
    except ValueError:
        parser.error("--cost-shapes takes answers x tokens pairs, e.g. 100x200,1000x20")
    if "chat:events" not in args.streams:
        parser.error("--streams must route chat:events")
    if min(args.answers, args.rate, args.viewers, args.fanout_rate) < 1 or args.seconds <= 0:
        parser.error("sizes, rates and --seconds must be positive")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(run, print_report, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
