"""Many jobs on one SSE connection against one connection per job: the gateway's CPU and
memory per job watched.

Run from the repository root: `.venv/bin/python -m bench.many_jobs_bench [--quick]` (or
`make bench-many-jobs`).

On fresh throwaway redis-servers (streams, Pub/Sub) with one `eco-router worker` routing,
each column on a fresh `eco-router serve --no-router` of this tree:
- `dashboards`: `--dashboards` connections to `GET /api/v1/streams`, each watching
  `--jobs-per-dashboard` jobs of its own (a dashboard of 50 jobs by default);
- `one per job`: the same jobs, one `GET /api/v1/scan/{job}/events` connection each.

Per column: RSS and CPU of opening them (per job watched), then `--rate` events/s round-robin
over every job for `--seconds`: events received, repeats or out of order (per job), latency
p50/p99 (the client's receive time less the entry id's milliseconds), gateway CPU per event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import uvloop

from bench.gateway_processes import (
    DOMAIN,
    Column,
    Gateway,
    open_files_for,
    ready_gateway,
    routed_servers,
)
from bench.reporting import RESULTS_DIR, ColumnsReport, ms, num, percentile, run_benchmark, step
from bench.sse_bench import SETTLE_S, publish_and_wait, ranked, rss_warmed_up
from bench.sse_client import (
    CONNECT_CONCURRENCY,
    CONNECT_TIMEOUT_S,
    SseConnection,
    Tally,
    open_connections,
)

RESULTS_PATH = RESULTS_DIR / "many_jobs.json"


class DashboardConnection(SseConnection):
    """One stream of many jobs: each frame names its job; order and repeats are per job."""

    def __init__(self, request: bytes, tally: Tally) -> None:
        super().__init__(request, tally, probe=True)
        self.last_seqs: dict[str, int] = {}

    def _frame(self, frame: bytes, received_ms: float) -> None:
        name = data = None
        for line in frame.split(b"\n"):
            key, _, value = line.partition(b": ")
            if key == b"event":
                name = value
            elif key == b"data":
                data = value
        if data is None:
            return  # a keepalive comment
        if not self.established.done():
            self.established.set_result(None)
        if name == b"snapshot" or name == b"error":
            self._tally.snapshots += name == b"snapshot"
            return
        body = orjson.loads(data)
        event = body["data"]
        seq = event["seq"]
        if seq <= self.last_seqs.get(body["job_id"], -1):
            self._tally.out_of_order += 1
        self.last_seqs[body["job_id"]] = seq
        self._tally.record(received_ms - int(event["stream_id"].partition("-")[0]))
        self._tally.count_frames(1)


async def open_dashboards(
    port: int, dashboards: Sequence[Sequence[str]], tally: Tally
) -> tuple[list[SseConnection], int]:
    """One connection per dashboard, established once its first frame (the snapshots of jobs
    not started) arrived; how many failed."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    established: list[SseConnection] = []
    failed = 0

    async def open_one(jobs: Sequence[str]) -> None:
        nonlocal failed
        query = "&".join(f"job={DOMAIN}:{job}" for job in jobs)
        request = (
            f"GET /api/v1/streams?{query} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        async with gate:
            try:
                _, connection = await loop.create_connection(
                    lambda: DashboardConnection(request, tally), "127.0.0.1", port
                )
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await connection.established
            except (OSError, TimeoutError):
                failed += 1
                return
        established.append(connection)

    await asyncio.gather(*(open_one(jobs) for jobs in dashboards))
    return established, failed


@dataclass(slots=True)
class Result:
    """The figures of one column."""

    title: str
    connections: int = 0
    established: int = 0
    failed: int = 0
    jobs_watched: int = 0
    connect_cpu_ms_per_job: float = 0.0
    rss_before_kib: int = 0
    rss_connected_kib: int = 0
    kib_per_job: float = 0.0
    rate: float = 0.0
    events_expected: int = 0
    events_received: int = 0
    out_of_order: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_percent: float = 0.0
    cpu_us_per_event: float | None = None


async def measure(
    gateway: Gateway, streams_url: str, args: argparse.Namespace, r: Result, *, dashboards: bool
) -> None:
    run_id = f"{time.time_ns():x}"
    r.rss_before_kib = await rss_warmed_up(gateway, run_id)
    per = args.jobs_per_dashboard
    jobs = [f"job-{run_id}-{n:05d}" for n in range(args.dashboards * per)]
    tally = Tally()
    cpu = gateway.cpu_seconds()
    if dashboards:
        step("connect", f"{args.dashboards:,} dashboards of {per} jobs, one connection each")
        groups = [jobs[n : n + per] for n in range(0, len(jobs), per)]
        connections, r.failed = await open_dashboards(gateway.port, groups, tally)
        r.connections = len(groups)
        r.jobs_watched = len(connections) * per
    else:
        step("connect", f"{len(jobs):,} connections, one per job")
        connections, failures = await open_connections(
            gateway.port, DOMAIN, jobs, tally, probes=len(jobs)
        )
        r.connections, r.failed = len(jobs), sum(failures.values())
        r.jobs_watched = len(connections)
    cpu = gateway.cpu_seconds() - cpu
    r.established = len(connections)
    r.connect_cpu_ms_per_job = round(1000 * cpu / max(1, r.jobs_watched), 3)
    await asyncio.sleep(SETTLE_S)
    r.rss_connected_kib = gateway.rss_kib()
    r.kib_per_job = round((r.rss_connected_kib - r.rss_before_kib) / max(1, r.jobs_watched), 2)
    gateway.check_alive()
    step("publish", f"{args.rate:,} events/s for {args.seconds:g} s over {len(jobs):,} jobs")
    cpu = gateway.cpu_seconds()
    sent, publish_s = await publish_and_wait(streams_url, jobs, args.rate, args.seconds, tally, 1)
    cpu = gateway.cpu_seconds() - cpu
    latencies = ranked(tally.latencies_ms, sent)
    r.rate = round(sent / publish_s, 1)
    r.events_expected, r.events_received = sent, tally.events
    r.out_of_order = tally.out_of_order
    r.p50_ms, r.p99_ms = percentile(latencies, 50), percentile(latencies, 99)
    r.cpu_percent = round(100 * cpu / publish_s, 1)
    if tally.events:
        r.cpu_us_per_event = round(1e6 * cpu / tally.events, 1)
    for connection in connections:
        connection.close()


Report = ColumnsReport[Result]


def run(args: argparse.Namespace) -> Report:
    jobs = args.dashboards * args.jobs_per_dashboard
    fds = open_files_for(jobs)
    results = []
    for title, dashboards in (("dashboards", True), ("one per job", False)):
        result = Result(title)
        print(f"== {title}", flush=True)
        with (
            routed_servers(jobs) as (streams, pubsub),
            ready_gateway(Column(title), streams, pubsub, fds=fds) as gateway,
        ):
            uvloop.run(measure(gateway, streams.url, args, result, dashboards=dashboards))
        results.append(result)
    return Report.of(args, results)


def print_report(report: Report) -> None:
    cols = report.columns
    row = report.print_head(
        "eco-router: many jobs on one connection,", label_width=36, column_width=20
    )
    row("connections established", [f"{c.established:,}/{c.connections:,}" for c in cols])
    row("jobs watched", [f"{c.jobs_watched:,}" for c in cols])
    row(
        "gateway CPU to open, per job (ms)", [num(c.connect_cpu_ms_per_job, "{:.3f}") for c in cols]
    )
    row(
        "RSS before / connected (MiB)",
        [f"{c.rss_before_kib / 1024:.0f} / {c.rss_connected_kib / 1024:.0f}" for c in cols],
    )
    row("RSS per job watched (KiB)", [num(c.kib_per_job, "{:.2f}") for c in cols])
    row("events/s published", [num(c.rate) for c in cols])
    row(
        "events received / expected", [f"{c.events_received:,}/{c.events_expected:,}" for c in cols]
    )
    row("out of order or repeated", [f"{c.out_of_order:,}" for c in cols])
    row("latency p50 / p99 (ms)", [f"{ms(c.p50_ms)} / {ms(c.p99_ms)}" for c in cols])
    row("gateway CPU (% of a core)", [num(c.cpu_percent, "{:.0f}") for c in cols])
    row("gateway CPU per event (us)", [num(c.cpu_us_per_event) for c in cols])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.many_jobs_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="4 dashboards, 5 s")
    parser.add_argument("--dashboards", type=int, help="dashboards (default 40)")
    parser.add_argument("--jobs-per-dashboard", type=int, default=50, help="jobs each (50)")
    parser.add_argument("--rate", type=int, default=1_000, help="events/s in all (1000)")
    parser.add_argument("--seconds", type=float, help="publishing time (default 15)")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    args.dashboards = args.dashboards or (4 if args.quick else 40)
    args.seconds = args.seconds or (5.0 if args.quick else 15.0)
    if min(args.dashboards, args.jobs_per_dashboard, args.rate) < 1 or args.seconds <= 0:
        parser.error("--dashboards, --jobs-per-dashboard, --rate and --seconds must be positive")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(run, print_report, parse_args(argv))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
