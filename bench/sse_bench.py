"""SSE gateway benchmark: concurrent connections, delivery latency and memory per connection.

Run from the repository root: `.venv/bin/python -m bench.sse_bench` (or `make bench-sse`).

- Two throwaway redis-server processes (streams, Pub/Sub) and one `eco-router serve`
  subprocess: the HTTP app with the router inside, as one gateway pod runs it.
- This process is the client: one asyncio loop holding `--connections` raw-socket SSE
  connections, each on its own job (`GET /api/v1/scan/{job}/events`). A connection counts as
  established once its first frame (the snapshot of a job not yet known) arrived: the gateway
  writes it after Redis confirmed the job's channel subscription.
- A separate producer process then publishes `--rate` events/s in all, round-robin over the
  jobs, for `--seconds`, through the producer API (`eco_router.producer.connect_async`, a few
  concurrent calls on its connection pool every tick, paced on a schedule).
- Latency = the client's receive time - the millisecond part of the entry id (`stream_id` in
  the event's data); same host, same clock; ids truncate to the millisecond.
- Memory per connection = (VmRSS of the serve process with every connection open - VmRSS
  before connecting, after one warm-up connection) / connections, from /proc/<pid>/status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import resource
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.pacing import Pacer
from bench.producer_process import ProducerProcess
from bench.redis_servers import redis_servers
from bench.reporting import RESULTS_DIR, environment, ms, percentile, run_benchmark, step
from bench.router_process import RouterProcess, eco_router_command, eco_router_env
from eco_router.producer import connect_async, producer_config

DOMAIN = "scan"
SHARDS = 4
RESULTS_PATH = RESULTS_DIR / "sse.json"

# File descriptors beyond one per connection: Redis pools, logs, the interpreter's own.
FD_HEADROOM = 1_024
CONNECT_CONCURRENCY = 200
CONNECT_TIMEOUT_S = 60.0
# Lets the allocator settle before RSS is read.
SETTLE_S = 1.0
WAIT_AFTER_S = 5.0
# Calls in flight on the producer's pool at most, when a tick has fallen behind.
PRODUCER_MAX_IN_FLIGHT = 100
POLL_INTERVAL_S = 0.05


# --------------------------------------------------------------------------- the gateway process


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE to at least `needed` (children inherit it); the limits now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft >= needed:
        return soft, hard
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            # Only root may raise the hard limit.
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
        except (ValueError, OSError) as error:
            raise SystemExit(
                f"need {needed} file descriptors but the hard limit is {hard} ({error}); "
                "raise it (ulimit -Hn) or lower --connections"
            ) from None
    else:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
            EVENT_ROUTER_CONSUMER_NAME="bench-gateway",
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

    def fd_limit(self) -> str:
        """The gateway's own `Max open files` soft limit, from /proc/<pid>/limits."""
        for line in Path(f"/proc/{self.process.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return line.split()[3]
        return "?"

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


# --------------------------------------------------------------------------- the producer process


async def produce(url: str, job_ids: Sequence[str], rate: int, seconds: float) -> tuple[int, float]:
    """Producer process: publish `rate` events/s for `seconds`, round-robin over `job_ids`."""
    publisher = connect_async(url, producer_config(domain=DOMAIN, shards=SHARDS))
    seqs = [0] * len(job_ids)

    async def publish(job: int) -> None:
        seqs[job] += 1
        seq = seqs[job]
        # A stage per seq: the producer's idempotency key is job, stage and status.
        await publisher.publish_stage_event(
            job_ids[job], f"step-{seq}", "started", seq=seq, progress=min(99, seq)
        )

    pacer = Pacer(rate, seconds, max_batch=PRODUCER_MAX_IN_FLIGHT)
    while not pacer.finished:
        await asyncio.gather(*(publish(n % len(job_ids)) for n in pacer.due()))
        await asyncio.sleep(pacer.pause_s())
    return pacer.sent, pacer.elapsed_s()


# --------------------------------------------------------------------------- the SSE client


class Tally:
    """What every connection received: latencies of live events and what went wrong."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.events = 0
        self.out_of_order = 0
        self.snapshots = 0
        self.problems: Counter[str] = Counter()
        self.all_received = asyncio.Event()
        self._expected: int | None = None

    def expect(self, events: int) -> None:
        """Set `all_received` once `events` live events arrived in all."""
        self._expected = events
        self._check()

    def record(self, latency_ms: float) -> None:
        self.events += 1
        self.latencies_ms.append(latency_ms)
        self._check()

    def _check(self) -> None:
        if self._expected is not None and self.events >= self._expected:
            self.all_received.set()


class SseConnection(asyncio.Protocol):
    """One SSE stream over a raw socket: HTTP/1.1 chunked decoding, then SSE frames."""

    def __init__(self, request: bytes, tally: Tally) -> None:
        self.established: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.last_seq = -1
        self._request = request
        self._tally = tally
        self._raw = bytearray()
        self._body = bytearray()
        self._headers_done = False
        self._chunked = False
        self._chunk_left = 0
        self._need_crlf = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        received_ms = time.time() * 1000
        self._raw += data
        if not self._headers_done and not self._read_headers():
            return
        if self._chunked:
            self._decode_chunks()
        else:
            self._body += self._raw
            self._raw.clear()
        body = self._body
        while (end := body.find(b"\n\n")) >= 0:
            frame = bytes(body[:end])
            del body[: end + 2]
            self._frame(frame, received_ms)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.established.done():
            self.established.set_exception(ConnectionError(f"closed before a frame: {exc}"))
        elif self.transport is not None:  # close() forgets the transport: not us
            self._tally.problems["closed by the gateway"] += 1

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def _read_headers(self) -> bool:
        end = self._raw.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self._raw[:end]).decode("latin-1").lower().split("\r\n")
        del self._raw[: end + 4]
        self._headers_done = True
        status = head[0].split(" ", 2)
        if len(status) < 2 or status[1] != "200":
            self._fail(f"HTTP {head[0]}")
            return False
        self._chunked = "transfer-encoding: chunked" in head
        return True

    def _decode_chunks(self) -> None:
        raw = self._raw
        while raw:
            if self._chunk_left:
                take = min(self._chunk_left, len(raw))
                self._body += raw[:take]
                del raw[:take]
                self._chunk_left -= take
                self._need_crlf = self._chunk_left == 0
            elif self._need_crlf:
                if len(raw) < 2:
                    return
                del raw[:2]
                self._need_crlf = False
            else:
                line_end = raw.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(bytes(raw[:line_end]).split(b";")[0], 16)
                del raw[: line_end + 2]
                if size == 0:
                    return  # the gateway ended the stream; connection_lost follows
                self._chunk_left = size

    def _frame(self, frame: bytes, received_ms: float) -> None:
        name = event_id = data = None
        for line in frame.split(b"\n"):
            key, _, value = line.partition(b": ")
            if key == b"event":
                name = value
            elif key == b"id":
                event_id = value
            elif key == b"data":
                data = value
        if name == b"snapshot":
            self._tally.snapshots += 1
            if not self.established.done():
                self.established.set_result(None)
            return
        if event_id is None or data is None:
            if data is not None:
                self._tally.problems[f"frame {frame[:60]!r}"] += 1
            return  # a keepalive comment
        seq = int(event_id)
        if seq <= self.last_seq:
            self._tally.out_of_order += 1
        self.last_seq = seq
        stream_id: str = orjson.loads(data)["stream_id"]
        self._tally.record(received_ms - int(stream_id.partition("-")[0]))

    def _fail(self, problem: str) -> None:
        if not self.established.done():
            self.established.set_exception(ConnectionError(problem))
        self.close()


async def open_connections(
    port: int, job_ids: Sequence[str], tally: Tally
) -> tuple[dict[str, SseConnection], Counter[str]]:
    """One SSE connection per job, `CONNECT_CONCURRENCY` opening at a time.

    Returns the established connections by job id, and the failures by reason (a failed
    connection is closed).
    """
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    established: dict[str, SseConnection] = {}
    failures: Counter[str] = Counter()

    async def open_one(job_id: str) -> None:
        request = (
            f"GET /api/v1/{DOMAIN}/{job_id}/events HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        connection: SseConnection | None = None
        async with gate:
            try:
                _, connection = await loop.create_connection(
                    lambda: SseConnection(request, tally), "127.0.0.1", port
                )
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await connection.established
            except (OSError, TimeoutError) as error:
                failures[f"{type(error).__name__}: {error}".rstrip(": ")] += 1
                if connection is not None:
                    connection.close()
                return
        established[job_id] = connection

    await asyncio.gather(*(open_one(job_id) for job_id in job_ids))
    return established, failures


# --------------------------------------------------------------------------- the run


@dataclass(slots=True)
class Report:
    """The figures of one run."""

    connections_wanted: int
    connections_established: int
    connect_failures: dict[str, int]
    connect_s: float
    target_rate: int
    achieved_rate: float
    publish_s: float
    events_expected: int
    events_received: int
    out_of_order: int
    problems: dict[str, int]
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    rss_before_kib: int
    rss_connected_kib: int
    rss_after_run_kib: int
    kib_per_connection: float
    kib_per_connection_after_run: float
    gateway_cpu_percent: float
    gateway_fd_limit: str
    client_fd_limit: int
    gateway_metrics: dict[str, float] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)


async def measure(gateway: Gateway, streams_url: str, args: argparse.Namespace) -> Report:
    tally = Tally()
    run_id = f"{int(time.time()):x}"

    # Warm-up: the first connection imports and allocates what every later one reuses.
    warm, _ = await open_connections(gateway.port, [f"bench-{run_id}-warmup"], Tally())
    for connection in warm.values():
        connection.close()
    await asyncio.sleep(SETTLE_S)
    rss_before = gateway.rss_kib()

    job_ids = [f"bench-{run_id}-{n:05d}" for n in range(args.connections)]
    step("connect", f"{args.connections:,} SSE connections, each on its own job")
    started = time.monotonic()
    connections, failures = await open_connections(gateway.port, job_ids, tally)
    connect_s = time.monotonic() - started
    await asyncio.sleep(SETTLE_S)
    rss_connected = gateway.rss_kib()
    gateway.check_alive()
    if not connections:
        raise RuntimeError(f"no connection established: {dict(failures)}\n{gateway.log_tail()}")

    # Only jobs someone watches get events, so every event has exactly one receiver.
    watched = [job_id for job_id in job_ids if job_id in connections]
    step("publish", f"{args.rate:,} events/s for {args.seconds:g} s over {len(watched):,} jobs")
    cpu_before = gateway.cpu_seconds()
    with ProducerProcess(
        produce, streams_url, watched, args.rate, args.seconds, name="sse-bench-producer"
    ) as producer:
        sent, publish_s = await producer.figures_async(
            2 * args.seconds + 30, poll_s=POLL_INTERVAL_S
        )
    cpu_seconds = gateway.cpu_seconds() - cpu_before
    tally.expect(sent)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT_AFTER_S):
            await tally.all_received.wait()
    rss_after = gateway.rss_kib()
    metrics = gateway.metrics()
    for connection in connections.values():
        connection.close()

    if failures or tally.problems:
        print(f"gateway log (last lines):\n{gateway.log_tail(40)}")
    latencies = sorted(tally.latencies_ms)
    # Events not received by the deadline rank as infinitely late, not as absent.
    ranked = latencies + [math.inf] * max(0, sent - len(latencies))
    established = len(connections)
    return Report(
        connections_wanted=args.connections,
        connections_established=established,
        connect_failures=dict(failures),
        connect_s=round(connect_s, 2),
        target_rate=args.rate,
        achieved_rate=round(sent / publish_s, 1),
        publish_s=round(publish_s, 2),
        events_expected=sent,
        events_received=tally.events,
        out_of_order=tally.out_of_order,
        problems=dict(tally.problems),
        p50_ms=percentile(ranked, 50),
        p90_ms=percentile(ranked, 90),
        p99_ms=percentile(ranked, 99),
        max_ms=percentile(ranked, 100),
        rss_before_kib=rss_before,
        rss_connected_kib=rss_connected,
        rss_after_run_kib=rss_after,
        kib_per_connection=round((rss_connected - rss_before) / established, 1),
        kib_per_connection_after_run=round((rss_after - rss_before) / established, 1),
        gateway_cpu_percent=round(100 * cpu_seconds / publish_s, 1),
        gateway_fd_limit=gateway.fd_limit(),
        client_fd_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        gateway_metrics=metrics,
    )


def run(args: argparse.Namespace) -> Report:
    fd_limit, _ = raise_fd_limit(args.connections + FD_HEADROOM)
    with redis_servers() as (streams, pubsub):
        step("gateway", "eco-router serve with the router inside, 2 throwaway redis-servers")
        with Gateway(streams.url, pubsub.url, fd_limit=fd_limit) as gateway:
            gateway.wait_ready()
            report = asyncio.run(measure(gateway, streams.url, args))
    report.environment = environment()
    return report


def print_report(report: Report) -> None:
    def row(label: str, value: str) -> None:
        print(f"{label:<40}{value}")

    env = report.environment
    print()
    print(f"eco-router SSE gateway benchmark: {env['cpus']} CPUs, Python {env['python']}")
    row(
        "connections established",
        f"{report.connections_established:,} / {report.connections_wanted:,} "
        f"in {report.connect_s:.1f} s",
    )
    if report.connect_failures:
        row("  failures", ", ".join(f"{k} x{v}" for k, v in report.connect_failures.items()))
    row(
        "publish rate (events/s)",
        f"{report.achieved_rate:,.0f} of {report.target_rate:,} for {report.publish_s:.1f} s",
    )
    row("events received / expected", f"{report.events_received:,} / {report.events_expected:,}")
    row("  out of order or repeated", f"{report.out_of_order:,}")
    if report.problems:
        row("  problems", ", ".join(f"{k} x{v}" for k, v in report.problems.items()))
    row("latency p50 / p90 (ms)", f"{ms(report.p50_ms)} / {ms(report.p90_ms)}")
    row("latency p99 / max (ms)", f"{ms(report.p99_ms)} / {ms(report.max_ms)}")
    row(
        "gateway RSS before / connected (MiB)",
        f"{report.rss_before_kib / 1024:.1f} / {report.rss_connected_kib / 1024:.1f} "
        f"(after the run {report.rss_after_run_kib / 1024:.1f})",
    )
    row(
        "gateway memory per connection (KiB)",
        f"{report.kib_per_connection:.1f} (after the run "
        f"{report.kib_per_connection_after_run:.1f})",
    )
    row("gateway CPU while publishing", f"{report.gateway_cpu_percent:.0f}% of one core")
    row(
        "open-files limit gateway / client",
        f"{report.gateway_fd_limit} / {report.client_fd_limit}",
    )
    dropped = report.gateway_metrics.get("event_router_gateway_events_dropped_total")
    if dropped:
        row("gateway: events dropped (slow client)", f"{dropped:,.0f}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sse_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--connections", type=int, default=1_000, help="SSE connections (default 1000)"
    )
    parser.add_argument(
        "--rate", type=int, default=1_000, help="events/s over all jobs (default 1000)"
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="publishing time (default 15)")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if args.connections < 1 or args.rate < 1 or args.seconds <= 0:
        parser.error("--connections, --rate and --seconds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(run, print_report, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
