"""SSE gateway benchmark: connections, delivery latency, fan-out, memory, CPU, GC, shutdown.

Run from the repository root: `.venv/bin/python -m bench.sse_bench [--quick]` (or
`make bench-sse`).

Every column of the table is one gateway, measured in the same run, each on fresh
throwaway redis-servers (streams, Pub/Sub) with one `eco-router worker` routing:
- `this tree`: `eco-router serve --no-router` of this checkout;
- `baseline`: the same command run from another commit's `src/` (`--baseline-ref`,
  PYTHONPATH, as the router benchmark does);
- `reference`: `bench/reference_gateway.py`, the reference design's gateway: one Pub/Sub
  subscription (connection) per client.

Per column, a fresh gateway process for the spread (then SIGTERM) and another for the
fan-out (the client runs on uvloop, as the gateway does):
1. Spread: `--connections` connections, each on its own job (accept rate, gateway CPU per
   accepted connection, RSS per connection), then `--rate` events/s round-robin over the
   jobs: latency p50/p99/max, gateway CPU per delivered event; full GC pauses of the
   gateway during all of it (logged by the gateway at DEBUG; the baseline may not log them).
2. SIGTERM with the spread's connections still open: how many streams got their end (clean)
   and how many were cut, and how long until the last one ended.
3. Fan-out: `--viewers` connections on one job, `--fanout-rate` events/s on it for
   `--seconds`: frames/s delivered, latency on `PROBES` decoding viewers, gateway CPU.

Latency = the client's receive time - the millisecond part of the entry id (`stream_id` in
the event's data); it includes the worker's routing. Same host, same clock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from bench.baseline_source import BaselineUnavailable, baseline_source
from bench.gateway_processes import (
    DOMAIN,
    SHARDS,
    Column,
    Gateway,
    open_files_for,
    ready_gateway,
    routed_servers,
)
from bench.pacing import Pacer
from bench.producer_process import ProducerProcess
from bench.reporting import RESULTS_DIR, ColumnsReport, ms, num, percentile, run_benchmark, step
from bench.sse_client import SseConnection, Tally, open_connections
from eco_router.producer import connect_async, producer_config

RESULTS_PATH = RESULTS_DIR / "sse.json"
SETTLE_S = 1.0
WAIT_AFTER_S = 5.0
PRODUCER_MAX_IN_FLIGHT = 100
POLL_INTERVAL_S = 0.05
PROBES = 200
SHUTDOWN_WAIT_S = 40.0


async def produce(url: str, job_ids: Sequence[str], rate: int, seconds: float) -> tuple[int, float]:
    """Producer process: publish `rate` events/s for `seconds`, round-robin over `job_ids`."""
    publisher = connect_async(url, producer_config(domain=DOMAIN, shards=SHARDS))
    seqs = [0] * len(job_ids)

    async def publish(job: int) -> None:
        seqs[job] += 1
        seq = seqs[job]
        await publisher.publish_stage_event(
            job_ids[job], f"step-{seq}", "started", seq=seq, progress=min(99, seq)
        )

    pacer = Pacer(rate, seconds, max_batch=PRODUCER_MAX_IN_FLIGHT)
    while not pacer.finished:
        await asyncio.gather(*(publish(n % len(job_ids)) for n in pacer.due()))
        await asyncio.sleep(pacer.pause_s())
    return pacer.sent, pacer.elapsed_s()


@dataclass(slots=True)
class Result:
    """The figures of one column."""

    title: str
    # fan-out
    viewers: int = 0
    fanout_established: int = 0
    fanout_rate: float = 0.0
    fanout_frames_per_s: float = 0.0
    fanout_frames: int = 0
    fanout_frames_expected: int = 0
    fanout_p50_ms: float | None = None
    fanout_p99_ms: float | None = None
    fanout_max_ms: float | None = None
    fanout_cpu_percent: float = 0.0
    fanout_cpu_us_per_frame: float | None = None
    # spread
    connections: int = 0
    established: int = 0
    connect_failures: dict[str, int] = field(default_factory=dict)
    connect_s: float = 0.0
    accept_per_s: float = 0.0
    connect_cpu_ms_per_connection: float = 0.0
    rss_before_kib: int = 0
    rss_connected_kib: int = 0
    kib_per_connection: float = 0.0
    rate: float = 0.0
    events_expected: int = 0
    events_received: int = 0
    out_of_order: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    cpu_percent: float = 0.0
    cpu_us_per_event: float | None = None
    gc_full: int | None = None
    gc_full_max_ms: float | None = None
    # SIGTERM
    shutdown_streams: int = 0
    shutdown_clean: int = 0
    shutdown_cut: int = 0
    shutdown_last_end_s: float | None = None
    shutdown_exit_s: float | None = None


def ranked(latencies: list[float], expected: int) -> list[float]:
    # Events not received by the deadline rank as infinitely late, not as absent.
    values = sorted(latencies)
    return values + [math.inf] * max(0, expected - len(values))


async def rss_warmed_up(gateway: Gateway, run_id: str) -> int:
    """The gateway's RSS (KiB) once one stream has come and gone, so that what the first one
    allocates for good is not counted per connection."""
    warm, _ = await open_connections(gateway.port, DOMAIN, [f"warm-{run_id}"], Tally(), probes=1)
    for connection in warm:
        connection.close()
    await asyncio.sleep(SETTLE_S)
    return gateway.rss_kib()


async def publish_and_wait(
    streams_url: str, jobs: Sequence[str], rate: int, seconds: float, tally: Tally, per_event: int
) -> tuple[int, float]:
    with ProducerProcess(
        produce, streams_url, jobs, rate, seconds, name="sse-bench-producer"
    ) as producer:
        sent, publish_s = await producer.figures_async(2 * seconds + 30, poll_s=POLL_INTERVAL_S)
    tally.expect(sent * per_event)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT_AFTER_S):
            await tally.all_received.wait()
    return sent, publish_s


async def fan_out(gateway: Gateway, streams_url: str, args: argparse.Namespace, r: Result) -> None:
    tally = Tally()
    job = f"fan-{time.time_ns():x}"
    step("fan-out", f"{args.viewers:,} viewers of one job, {args.fanout_rate} events/s")
    viewers, failures = await open_connections(
        gateway.port, DOMAIN, [job] * args.viewers, tally, probes=PROBES
    )
    r.viewers, r.fanout_established = args.viewers, len(viewers)
    await asyncio.sleep(SETTLE_S)
    cpu = gateway.cpu_seconds()
    sent, publish_s = await publish_and_wait(
        streams_url, [job], args.fanout_rate, args.seconds, tally, len(viewers)
    )
    cpu = gateway.cpu_seconds() - cpu
    for viewer in viewers:
        viewer.close()
    latencies = ranked(tally.latencies_ms, sent * min(PROBES, len(viewers)))
    r.fanout_rate = round(sent / publish_s, 1)
    r.fanout_frames, r.fanout_frames_expected = tally.frames, sent * len(viewers)
    r.fanout_frames_per_s = round(tally.frames_per_s())
    r.fanout_p50_ms = percentile(latencies, 50)
    r.fanout_p99_ms = percentile(latencies, 99)
    r.fanout_max_ms = percentile(latencies, 100)
    r.fanout_cpu_percent = round(100 * cpu / publish_s, 1)
    if tally.frames:
        r.fanout_cpu_us_per_frame = round(1e6 * cpu / tally.frames, 1)
    if failures:
        r.connect_failures.update({f"fan-out: {k}": v for k, v in failures.items()})
    await asyncio.sleep(SETTLE_S)


async def spread(
    gateway: Gateway, streams_url: str, args: argparse.Namespace, r: Result
) -> list[SseConnection]:
    tally = Tally()
    run_id = f"{time.time_ns():x}"
    r.rss_before_kib = await rss_warmed_up(gateway, run_id)
    jobs = [f"job-{run_id}-{n:05d}" for n in range(args.connections)]
    step("connect", f"{args.connections:,} SSE connections, each on its own job")
    cpu, started = gateway.cpu_seconds(), time.monotonic()
    connections, failures = await open_connections(
        gateway.port, DOMAIN, jobs, tally, probes=len(jobs)
    )
    r.connect_s = round(time.monotonic() - started, 2)
    cpu = gateway.cpu_seconds() - cpu
    r.connections, r.established = args.connections, len(connections)
    r.connect_failures.update(failures)
    r.accept_per_s = round(len(connections) / r.connect_s)
    r.connect_cpu_ms_per_connection = round(1000 * cpu / max(1, len(connections)), 2)
    await asyncio.sleep(SETTLE_S)
    r.rss_connected_kib = gateway.rss_kib()
    r.kib_per_connection = round(
        (r.rss_connected_kib - r.rss_before_kib) / max(1, len(connections)), 1
    )
    gateway.check_alive()
    watched = [c._request.split(b"/")[4].decode() for c in connections]
    step("publish", f"{args.rate:,} events/s for {args.seconds:g} s over {len(watched):,} jobs")
    cpu = gateway.cpu_seconds()
    sent, publish_s = await publish_and_wait(
        streams_url, watched, args.rate, args.seconds, tally, 1
    )
    cpu = gateway.cpu_seconds() - cpu
    latencies = ranked(tally.latencies_ms, sent)
    r.rate = round(sent / publish_s, 1)
    r.events_expected, r.events_received = sent, tally.events
    r.out_of_order, r.problems = tally.out_of_order, dict(tally.problems)
    r.p50_ms, r.p99_ms, r.max_ms = (percentile(latencies, p) for p in (50, 99, 100))
    r.cpu_percent = round(100 * cpu / publish_s, 1)
    if tally.events:
        r.cpu_us_per_event = round(1e6 * cpu / tally.events, 1)
    pauses = gateway.gc_pauses_ms()
    r.gc_full = len(pauses)
    r.gc_full_max_ms = max(pauses, default=None)
    r.shutdown_streams = len(connections)
    return connections


async def shutdown(gateway: Gateway, connections: list[SseConnection], r: Result) -> None:
    step("SIGTERM", f"with {len(connections):,} streams open")
    tally = connections[0]._tally if connections else Tally()
    sent_at = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    last_end = None
    deadline = sent_at + SHUTDOWN_WAIT_S
    while time.monotonic() < deadline:
        open_now = sum(not c.lost for c in connections)
        if open_now == 0:
            break
        if gateway.process.poll() is not None and r.shutdown_exit_s is None:
            r.shutdown_exit_s = round(time.monotonic() - sent_at, 2)
        await asyncio.sleep(0.02)
    last_end = time.monotonic() - sent_at
    with contextlib.suppress(Exception):
        await asyncio.to_thread(gateway.process.wait, SHUTDOWN_WAIT_S)
    if r.shutdown_exit_s is None and gateway.process.returncode is not None:
        r.shutdown_exit_s = round(time.monotonic() - sent_at, 2)
    r.shutdown_clean = tally.clean_ends
    r.shutdown_cut = tally.cut + sum(not c.lost for c in connections)
    r.shutdown_last_end_s = round(last_end, 2)
    for connection in connections:
        connection.close()


def run_column(column: Column, args: argparse.Namespace, fds: int) -> Result:
    result = Result(column.title)
    print(f"== {column.title}", flush=True)
    with routed_servers(max(args.connections, args.viewers)) as (streams, pubsub):
        # A fresh gateway per scenario: RSS per connection is measured on a heap the fan-out
        # has not grown, and the SIGTERM ends the first one.
        with ready_gateway(column, streams, pubsub, fds=fds) as gateway:

            async def spread_and_stop() -> None:
                connections = await spread(gateway, streams.url, args, result)
                await shutdown(gateway, connections, result)

            uvloop.run(spread_and_stop())
        if args.viewers:
            with ready_gateway(column, streams, pubsub, fds=fds) as gateway:
                uvloop.run(fan_out(gateway, streams.url, args, result))
    return result


Report = ColumnsReport[Result]


def run(args: argparse.Namespace) -> Report:
    fds = open_files_for(max(args.connections, args.viewers))
    columns = [Column("this tree")]
    results = []
    with ExitStack() as stack:
        if args.baseline_ref:
            try:
                source = stack.enter_context(
                    baseline_source(args.baseline_ref, args.baseline_python)
                )
                columns.append(Column(f"baseline {source.commit}", source=source))
            except BaselineUnavailable as error:
                print(f"baseline skipped: {error}")
        if args.reference:
            columns.append(Column("reference", reference=True))
        for column in columns:
            results.append(run_column(column, args, fds))
    return Report.of(args, results)


def print_report(report: Report) -> None:
    cols = report.columns
    row = report.print_head("eco-router SSE gateway benchmark:", label_width=40, column_width=22)
    print("fan-out: viewers of one job")
    row("  viewers established", [f"{c.fanout_established:,}/{c.viewers:,}" for c in cols])
    row("  events/s published", [num(c.fanout_rate) for c in cols])
    row(
        "  frames delivered / expected",
        [f"{c.fanout_frames:,}/{c.fanout_frames_expected:,}" for c in cols],
    )
    row("  frames/s delivered", [num(c.fanout_frames_per_s, "{:,.0f}") for c in cols])
    row(
        "  latency p50 / p99 (ms)", [f"{ms(c.fanout_p50_ms)} / {ms(c.fanout_p99_ms)}" for c in cols]
    )
    row("  latency max (ms)", [ms(c.fanout_max_ms) for c in cols])
    row("  gateway CPU (% of a core)", [num(c.fanout_cpu_percent, "{:.0f}") for c in cols])
    row("  gateway CPU per frame (us)", [num(c.fanout_cpu_us_per_frame) for c in cols])
    print("spread: one connection per job")
    row("  connections established", [f"{c.established:,}/{c.connections:,}" for c in cols])
    row("  connect time (s)", [num(c.connect_s, "{:.1f}") for c in cols])
    row("  accepted connections/s", [num(c.accept_per_s, "{:,.0f}") for c in cols])
    row(
        "  gateway CPU per connection (ms)",
        [num(c.connect_cpu_ms_per_connection, "{:.2f}") for c in cols],
    )
    row(
        "  RSS before / connected (MiB)",
        [f"{c.rss_before_kib / 1024:.0f} / {c.rss_connected_kib / 1024:.0f}" for c in cols],
    )
    row("  RSS per connection (KiB)", [num(c.kib_per_connection) for c in cols])
    row("  events/s published", [num(c.rate) for c in cols])
    row(
        "  events received / expected",
        [f"{c.events_received:,}/{c.events_expected:,}" for c in cols],
    )
    row("  out of order or repeated", [f"{c.out_of_order:,}" for c in cols])
    row("  latency p50 / p99 (ms)", [f"{ms(c.p50_ms)} / {ms(c.p99_ms)}" for c in cols])
    row("  latency max (ms)", [ms(c.max_ms) for c in cols])
    row("  gateway CPU (% of a core)", [num(c.cpu_percent, "{:.0f}") for c in cols])
    row("  gateway CPU per event (us)", [num(c.cpu_us_per_event) for c in cols])
    row(
        "  full GCs / longest (ms)",
        [f"{num(c.gc_full, '{}')} / {num(c.gc_full_max_ms)}" for c in cols],
    )
    print("SIGTERM with the spread's streams open")
    row(
        "  streams ended cleanly / open",
        [f"{c.shutdown_clean:,}/{c.shutdown_streams:,}" for c in cols],
    )
    row("  streams cut", [f"{c.shutdown_cut:,}" for c in cols])
    row("  last stream ended after (s)", [num(c.shutdown_last_end_s, "{:.2f}") for c in cols])
    row("  process exited after (s)", [num(c.shutdown_exit_s, "{:.2f}") for c in cols])
    for c in cols:
        if c.connect_failures or c.problems:
            print(f"{c.title}: failures {c.connect_failures} problems {c.problems}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sse_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="2,000 connections, 1,000 viewers, 5 s"
    )
    parser.add_argument("--connections", type=int, help="spread connections (default 10000)")
    parser.add_argument("--rate", type=int, default=1_000, help="spread events/s (default 1000)")
    parser.add_argument("--viewers", type=int, help="fan-out viewers of one job (default 5000)")
    parser.add_argument("--fanout-rate", type=int, default=20, help="fan-out events/s (20)")
    parser.add_argument("--seconds", type=float, help="publishing time (default 15)")
    parser.add_argument(
        "--baseline-ref", default="main", help="commit for the baseline column ('' for none)"
    )
    parser.add_argument(
        "--baseline-python",
        default=None,
        help="the interpreter of the baseline column (default this one), e.g. another venv's",
    )
    parser.add_argument(
        "--no-reference", dest="reference", action="store_false", help="skip the reference"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    quick = args.quick
    args.connections = args.connections or (2_000 if quick else 10_000)
    args.viewers = args.viewers if args.viewers is not None else (1_000 if quick else 5_000)
    args.seconds = args.seconds or (5.0 if quick else 15.0)
    if args.connections < 1 or args.rate < 1 or args.seconds <= 0:
        parser.error("--connections, --rate and --seconds must be positive")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(run, print_report, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
