"""Soak test: does memory level off under hours-like load? For operators, not for CI.

Run from the repository root: `make soak` (`make soak MINUTES=2` for a short one), or
`.venv/bin/python -m bench.soak [--minutes 10] [--clients 200] [--rate 500]
[--events-per-job 20]`.

- Two throwaway redis-server processes (streams, Pub/Sub), one `eco-router worker` and one
  `eco-router serve` gateway (which runs a router of its own in the same consumer group, as a
  gateway pod does): the two routers share the load.
- A separate producer process publishes `--rate` events/s through the producer API for
  `--minutes`: `--clients` jobs run at once, each `--events-per-job` events (seq 1, 2, ...,
  the last one `done`); a finished job is replaced by a new one.
- This process holds `--clients` SSE clients on the gateway. Each watches one job until its
  `done` event, checks the seqs it got, then reconnects to the next job, in the order the
  producer starts them.
- Every minute it prints the worker's and the gateway's RSS (VmRSS from /proc/<pid>/status)
  with the events published and delivered in that minute.
- At the end: RSS has levelled off when it grew less than 10% over the last 5 minutes (the
  second half of a run shorter than 10 minutes), for the worker and for the gateway alike.

Exit code 1 when either process's RSS did not level off, when no client saw a job to its end,
or when a client got a seq twice, out of order, or a stream that did not end at the job's last
seq; 0 otherwise. A job whose client missed an intermediate seq is counted and shown, not
failed: with two routers in one group, two events of a job can go to different routers, and
when the one holding the older event stalls (a busy machine), the newer one is applied and
published first, so the older one is stale or dropped by the gateway's filter, while the
job still ends at its last seq. The figures are also written to `bench/results/soak.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import multiprocessing.sharedctypes
import resource
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.gateway_processes import DOMAIN, FD_HEADROOM, SHARDS, free_port, raise_fd_limit
from bench.pacing import Pacer
from bench.producer_process import ProducerProcess
from bench.redis_servers import redis_servers
from bench.reporting import RESULTS_DIR, environment, step, write_json
from bench.router_process import RouterProcess, eco_router_command, eco_router_env
from bench.routers import Worker
from bench.sse_bench import PRODUCER_MAX_IN_FLIGHT
from eco_router.producer import connect_async, producer_config

RESULTS_PATH = RESULTS_DIR / "soak.json"

GROWTH_LIMIT = 0.10
WINDOW_MINUTES = 5
POLL_INTERVAL_S = 0.05
# Beyond the gateway's 15 s keepalive: a silent stream this long is broken.
CLIENT_READ_TIMEOUT_S = 60.0
CLIENT_RETRY_S = 0.5
CLIENT_STOP_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------- the producer process


def job_id(run_id: str, number: int) -> str:
    """The producer and the clients agree on job ids and their order by this name alone."""
    return f"soak-{run_id}-{number:08d}"


async def produce(
    url: str,
    run_id: str,
    *,
    jobs: int,
    events_per_job: int,
    rate: int,
    seconds: float,
    sent: multiprocessing.sharedctypes.Synchronized[int],
) -> tuple[int, int, float]:
    """Producer process: `rate` events/s for `seconds` over `jobs` jobs running at once."""
    publisher = connect_async(url, producer_config(domain=DOMAIN, shards=SHARDS))
    # Slot i runs job numbers[i], whose next event is seqs[i]; a finished job makes way for
    # the next number, so jobs start in number order.
    numbers = list(range(jobs))
    seqs = [1] * jobs
    started_jobs = jobs
    in_flight = min(PRODUCER_MAX_IN_FLIGHT, jobs)  # never two events of one job at once

    async def publish(slot: int) -> None:
        nonlocal started_jobs
        job, seq = job_id(run_id, numbers[slot]), seqs[slot]
        if seq < events_per_job:
            seqs[slot] += 1
            # A stage per seq: the producer's idempotency key is job, stage and status.
            await publisher.publish_stage_event(
                job, f"step-{seq}", "started", seq=seq, progress=seq * 100 // events_per_job
            )
            return
        numbers[slot], seqs[slot] = started_jobs, 1
        started_jobs += 1
        await publisher.publish_stage_event(
            job, "done", "done", seq=seq, progress=100, result={"soak": True}
        )

    pacer = Pacer(rate, seconds, max_batch=in_flight)
    while not pacer.finished:
        if batch := pacer.due():
            await asyncio.gather(*(publish(n % jobs) for n in batch))
            sent.value = pacer.sent
        await asyncio.sleep(pacer.pause_s())
    return pacer.sent, started_jobs, pacer.elapsed_s()


# --------------------------------------------------------------------------- the SSE clients


@dataclass(slots=True)
class Deliveries:
    """What the clients received, in all."""

    events: int = 0
    jobs_done: int = 0
    skipped_jobs: int = 0
    bad_jobs: int = 0
    connections: int = 0
    problems: Counter[str] = field(default_factory=Counter)


class Clients:
    """`count` SSE clients, each watching a job to its end, then the next job in line."""

    def __init__(self, base_url: str, run_id: str, events_per_job: int) -> None:
        self.tally = Deliveries()
        self._base_url = base_url
        self._run_id = run_id
        self._events_per_job = events_per_job
        self._next_job = 0

    async def run(self, count: int, stop: asyncio.Event) -> None:
        limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
        timeout = httpx.Timeout(10.0, read=CLIENT_READ_TIMEOUT_S)
        async with httpx.AsyncClient(base_url=self._base_url, limits=limits, timeout=timeout) as c:
            clients = [asyncio.create_task(self._client(c, stop)) for _ in range(count)]
            await stop.wait()
            for task in clients:
                task.cancel()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLIENT_STOP_TIMEOUT_S):
                    await asyncio.gather(*clients, return_exceptions=True)

    async def _client(self, http: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            number, self._next_job = self._next_job, self._next_job + 1
            try:
                await self._watch(http, job_id(self._run_id, number))
            except (httpx.HTTPError, ValueError) as error:
                self.tally.problems[type(error).__name__] += 1
                await asyncio.sleep(CLIENT_RETRY_S)

    async def _watch(self, http: httpx.AsyncClient, job: str) -> None:
        seqs: list[int] = []
        event = ""
        self.tally.connections += 1
        async with http.stream("GET", f"/api/v1/{DOMAIN}/{job}/events") as response:
            if response.status_code != 200:
                self.tally.problems[f"HTTP {response.status_code}"] += 1
                await asyncio.sleep(CLIENT_RETRY_S)
                return
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("id: "):
                    seqs.append(int(line.removeprefix("id: ")))
                    self.tally.events += 1
                elif not line and event in ("done", "error"):
                    break
        if event != "done":
            self.tally.problems[f"stream ended on {event or 'nothing'!r}"] += 1
            return
        self.tally.jobs_done += 1
        if seqs == list(range(1, self._events_per_job + 1)):
            return
        in_order = all(a < b for a, b in itertools.pairwise(seqs))
        if in_order and seqs[-1:] == [self._events_per_job]:
            self.tally.skipped_jobs += 1
            if self.tally.skipped_jobs <= 3:
                print(f"note: {job}: intermediate seqs missing from {seqs}", flush=True)
            return
        self.tally.bad_jobs += 1
        if self.tally.bad_jobs <= 5:
            print(f"error: {job} delivered seqs {seqs}", flush=True)


# --------------------------------------------------------------------------- the run


@dataclass(slots=True)
class Minute:
    """One line of the per-minute table."""

    minute: int
    worker_rss_kib: int
    gateway_rss_kib: int
    published: int
    delivered: int
    jobs_done: int


@dataclass(slots=True)
class Report:
    minutes: int
    clients: int
    target_rate: int
    events_per_job: int
    window_minutes: int
    samples: list[Minute] = field(default_factory=list)
    events_published: int = 0
    jobs_started: int = 0
    publish_s: float = 0.0
    events_delivered: int = 0
    jobs_done: int = 0
    skipped_jobs: int = 0
    bad_jobs: int = 0
    connections: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    # Summed over both routers: the producer sends each seq once and in order, so every
    # stale verdict is an older event that reached a router after a newer one was applied.
    stale_verdicts: int = 0
    duplicate_verdicts: int = 0
    gateway_dropped: int = 0
    gateway_overtaken: int = 0
    worker_growth: float = 0.0
    gateway_growth: float = 0.0
    levelled_off: bool = False
    passed: bool = False
    environment: dict[str, Any] = field(default_factory=dict)


def growth(samples: Sequence[Minute], window: int, key: str) -> float:
    """Relative RSS growth from `window` minutes before the end to the end."""
    start, end = getattr(samples[-1 - window], key), getattr(samples[-1], key)
    return float((end - start) / start)


class Gateway(RouterProcess):
    """`eco-router serve` (router and SSE gateway in one process) on a free loopback port."""

    # uvicorn re-raises the SIGTERM it handled once it has shut down gracefully.
    clean_exits = (0, -signal.SIGTERM, -signal.SIGKILL)
    stop_timeout_s = 15.0

    def __init__(self, streams_url: str, pubsub_url: str, *, fd_limit: int) -> None:
        self.port = free_port()
        env = eco_router_env(
            streams_url,
            pubsub_url,
            EVENT_ROUTER_STREAMS=f"{DOMAIN}:events={SHARDS}",
            EVENT_ROUTER_CONSUMER_NAME="soak-gateway",
            EVENT_ROUTER_LOG_LEVEL="WARNING",
            EVENT_ROUTER_GATEWAY_METRICS="true",
        )
        command = eco_router_command("serve", "--host", "127.0.0.1", "--port", str(self.port))

        def limit_fds() -> None:
            # Inherited anyway; set explicitly so the gateway's limit does not depend on ours.
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        super().__init__(command, env=env, name="gateway", preexec_fn=limit_fds)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def http_url(self) -> str:
        return self.base_url

    def metrics(self) -> dict[str, float]:
        """The gateway's own counters from /metrics (unlabelled sums), or {} if unreachable."""
        text = self.http_get("/metrics", timeout=5)
        if text is None:
            return {}
        figures: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("event_router_gateway_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                key = name.partition("{")[0]
                figures[key] = figures.get(key, 0.0) + float(value)
        return figures


async def soak(
    gateway: Gateway, worker: Worker, streams_url: str, args: argparse.Namespace
) -> Report:
    window = min(WINDOW_MINUTES, args.minutes // 2)
    report = Report(args.minutes, args.clients, args.rate, args.events_per_job, window)
    run_id = f"{int(time.time()):x}"
    clients = Clients(gateway.base_url, run_id, args.events_per_job)
    stop_clients = asyncio.Event()
    watching = asyncio.create_task(clients.run(args.clients, stop_clients))

    sent = multiprocessing.get_context("spawn").Value("q", 0)
    producer = ProducerProcess(
        produce,
        streams_url,
        run_id,
        jobs=args.clients,
        events_per_job=args.events_per_job,
        rate=args.rate,
        seconds=args.minutes * 60,
        sent=sent,
        name="soak-producer",
    )
    with producer:
        started = time.monotonic()
        tally = clients.tally
        last = Minute(0, worker.rss_kib(), gateway.rss_kib(), 0, 0, 0)
        report.samples.append(last)
        print(
            f"{'minute':>6} {'worker RSS MiB':>15} {'gateway RSS MiB':>16} {'published':>10} "
            f"{'delivered':>10} {'jobs done':>10} {'problems':>9}",
            flush=True,
        )
        _print_minute(last, 0)
        try:
            for minute in range(1, args.minutes + 1):
                while time.monotonic() < started + 60 * minute:
                    worker.check_alive()
                    gateway.check_alive()
                    if watching.done():
                        watching.result()
                        raise RuntimeError("the SSE clients stopped")
                    await asyncio.sleep(1.0)
                sample = Minute(
                    minute,
                    worker.rss_kib(),
                    gateway.rss_kib(),
                    sent.value,
                    tally.events,
                    tally.jobs_done,
                )
                _print_minute(sample, sum(tally.problems.values()), previous=last)
                report.samples.append(sample)
                last = sample
            # The producer publishes its last events right at the end of the last minute.
            figures = await producer.figures_async(30, poll_s=POLL_INTERVAL_S)
            report.events_published, report.jobs_started, report.publish_s = figures
        finally:
            stop_clients.set()
            await watching

    report.events_delivered = tally.events
    report.jobs_done = tally.jobs_done
    report.skipped_jobs = tally.skipped_jobs
    report.bad_jobs = tally.bad_jobs
    report.connections = tally.connections
    report.problems = dict(tally.problems)
    report.worker_growth = round(growth(report.samples, window, "worker_rss_kib"), 4)
    report.gateway_growth = round(growth(report.samples, window, "gateway_rss_kib"), 4)
    report.levelled_off = max(report.worker_growth, report.gateway_growth) < GROWTH_LIMIT
    report.passed = report.levelled_off and report.jobs_done > 0 and report.bad_jobs == 0
    return report


def _print_minute(sample: Minute, problems: int, previous: Minute | None = None) -> None:
    published = sample.published - (previous.published if previous else 0)
    delivered = sample.delivered - (previous.delivered if previous else 0)
    jobs = sample.jobs_done - (previous.jobs_done if previous else 0)
    print(
        f"{sample.minute:>6} {sample.worker_rss_kib / 1024:>15.1f} "
        f"{sample.gateway_rss_kib / 1024:>16.1f} {published:>10,} {delivered:>10,} "
        f"{jobs:>10,} {problems:>9,}",
        flush=True,
    )


def run(args: argparse.Namespace) -> Report:
    fd_limit, _ = raise_fd_limit(args.clients + FD_HEADROOM)
    with redis_servers() as (streams, pubsub):
        step("processes", "2 throwaway redis-servers, eco-router worker, eco-router serve")
        with (
            Worker(streams.url, pubsub.url, read_count=100, name="soak-worker") as worker,
            Gateway(streams.url, pubsub.url, fd_limit=fd_limit) as gateway,
        ):
            worker.wait_ready()
            gateway.wait_ready()
            step(
                "soak",
                f"{args.minutes} min, {args.rate:,} events/s, {args.clients:,} SSE clients, "
                f"{args.events_per_job} events per job",
            )
            report = asyncio.run(soak(gateway, worker, streams.url, args))
            routers = [worker.router_figures(), gateway.router_figures()]
            report.stale_verdicts = int(sum(f.get("stale", 0) for f in routers))
            report.duplicate_verdicts = int(sum(f.get("duplicate", 0) for f in routers))
            figures = gateway.metrics()
            report.gateway_dropped = int(
                figures.get("event_router_gateway_events_dropped_total", 0)
            )
            overtaken = figures.get("event_router_gateway_events_overtaken_total", 0)
            report.gateway_overtaken = int(overtaken)
    report.environment = environment()
    return report


def print_report(report: Report) -> None:
    def row(label: str, value: str) -> None:
        print(f"{label:<40}{value}")

    print()
    row(
        "events published / delivered",
        f"{report.events_published:,} in {report.publish_s:.0f} s / {report.events_delivered:,}",
    )
    row("jobs started / watched to done", f"{report.jobs_started:,} / {report.jobs_done:,}")
    row("  missing an intermediate seq", f"{report.skipped_jobs:,}")
    row("  with a repeated or out-of-order seq", f"{report.bad_jobs:,}")
    row(
        "router verdicts stale / duplicate",
        f"{report.stale_verdicts:,} / {report.duplicate_verdicts:,}",
    )
    row("gateway events overtaken (not sent)", f"{report.gateway_overtaken:,}")
    row("gateway events dropped (slow clients)", f"{report.gateway_dropped:,}")
    row("SSE connections opened", f"{report.connections:,}")
    if report.problems:
        row("  problems", ", ".join(f"{k} x{v}" for k, v in report.problems.items()))
    window = f"over the last {report.window_minutes} min"
    row(f"worker RSS growth {window}", f"{100 * report.worker_growth:+.1f}%")
    row(f"gateway RSS growth {window}", f"{100 * report.gateway_growth:+.1f}%")
    verdict = "levelled off" if report.levelled_off else "still growing"
    print(f"RSS {verdict} (limit {100 * GROWTH_LIMIT:.0f}% {window})")
    print("PASS" if report.passed else "FAIL")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=int, default=10, help="length (default 10, min 2)")
    parser.add_argument("--clients", type=int, default=200, help="SSE clients (default 200)")
    parser.add_argument("--rate", type=int, default=500, help="events/s (default 500)")
    parser.add_argument(
        "--events-per-job", type=int, default=20, help="events of one job (default 20)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if args.minutes < 2 or args.clients < 1 or args.rate < 1 or args.events_per_job < 2:
        parser.error("--minutes >= 2, --clients >= 1, --rate >= 1, --events-per-job >= 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print_report(report)
    write_json(report, args.output)
    print(f"wrote {args.output}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
