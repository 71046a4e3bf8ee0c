"""Control benchmark: a viewer's POST to a job's worker, and the worker's cancellation check.

Run from the repository root: `.venv/bin/python -m bench.control_bench [--quick]` (or
`make bench-control`).

It starts throwaway redis-servers (streams, Pub/Sub) and this tree's `eco-router serve` (the
router inside) on the default settings, then:

1. Latency: `--messages` times, one after the other, a worker thread waits on the sync
   SDK's `next_control` for a fresh chat job, and this process POSTs an input to
   `/api/v1/chat/{job}/input`: the time to the 202 (recorded durably) and to the worker's SDK
   handing it over, p50 and p99 (same machine, same clock).
2. The cancellation check: `publisher.cancelled(job)` called `--calls` times, sync and
   asyncio, on a job without a cancel (one read each) and on a cancelled one (none).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from bench.redis_servers import redis_servers
from bench.reporting import percentile, run_benchmark, step
from eco_router.adapters.redis.keys import JobKeys
from eco_router.producer import StreamPublisher, connect, connect_async, producer_config


@dataclass
class Report:
    messages: int = 0
    accepted_ms: dict[str, float | None] = field(default_factory=dict)
    delivered_ms: dict[str, float | None] = field(default_factory=dict)
    check_us: dict[str, float] = field(default_factory=dict)
    calls: int = 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(
    streams_url: str, pubsub_url: str, log: Path, settings: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """This tree's `eco-router serve` on the default settings (and `settings`), once ready."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ROUTER_", "REDIS_"))}
    env |= {"REDIS_STREAMS_URL": streams_url, "REDIS_PUBSUB_URL": pubsub_url}
    env |= dict(settings or {})
    port = _free_port()
    script = Path(sys.executable).with_name("eco-router")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(script), "serve", "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=base, trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                if client.get("/ready").status_code == 200:
                    return process, base
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    process.kill()
    raise SystemExit(f"serve did not become ready:\n{log.read_text()[-2000:]}")


def started(publisher: StreamPublisher, streams_url: str, job: str) -> None:
    """Publish the job's `queued` and wait until the router applied it: a job without any
    event takes no control message."""
    publisher.publish_stage_event(job, "queued", "queued")
    state = JobKeys.in_family(producer_config(domain="chat", shards=4).family, job).state
    with redis.Redis.from_url(streams_url) as client:
        deadline = time.monotonic() + 10
        while not client.exists(state):
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job}'s queued was not routed within 10 s")
            time.sleep(0.002)


def _latency(base: str, streams_url: str, count: int) -> tuple[list[float], list[float]]:
    publisher = connect(streams_url, producer_config(domain="chat", shards=4))
    accepted: list[float] = []
    delivered: list[float] = []
    with httpx.Client(base_url=base, trust_env=False, timeout=10) as client:
        for n in range(count):
            job = f"bench-control-{n}"
            started(publisher, streams_url, job)
            seen: list[float] = []
            waiting = threading.Event()

            def work(
                job: str = job, seen: list[float] = seen, waiting: threading.Event = waiting
            ) -> None:
                waiting.set()
                message = publisher.next_control(job, timeout_s=10)
                seen.append(time.perf_counter())
                if message is not None:
                    publisher.acknowledge(message)

            worker = threading.Thread(target=work)
            worker.start()
            waiting.wait()
            time.sleep(0.002)  # the worker is in its blocking read
            sent = time.perf_counter()
            response = client.post(
                f"/api/v1/chat/{job}/input", json={"request_id": f"r{n}", "input": "yes"}
            )
            answered = time.perf_counter()
            worker.join()
            if response.status_code != 202:
                raise SystemExit(f"POST answered {response.status_code}: {response.text}")
            accepted.append((answered - sent) * 1000)
            delivered.append((seen[0] - sent) * 1000)
    return sorted(accepted), sorted(delivered)


def _check_cost(base: str, streams_url: str, calls: int) -> dict[str, float]:
    config = producer_config(domain="chat", shards=4)
    publisher = connect(streams_url, config)
    started(publisher, streams_url, "bench-cancelled")
    with httpx.Client(base_url=base, trust_env=False, timeout=10) as client:
        sent = client.post("/api/v1/chat/bench-cancelled/cancel", headers={"Idempotency-Key": "c"})
        if sent.status_code != 202:
            raise SystemExit(f"POST answered {sent.status_code}: {sent.text}")
    out: dict[str, float] = {}
    for job, label in (("bench-running", "not cancelled"), ("bench-cancelled", "cancelled")):
        publisher.cancelled(job)
        start = time.perf_counter()
        for _ in range(calls):
            publisher.cancelled(job)
        out[f"sync, {label}"] = (time.perf_counter() - start) / calls * 1e6

    async def run_async() -> None:
        async_publisher = connect_async(streams_url, config)
        for job, label in (("bench-running", "not cancelled"), ("bench-cancelled", "cancelled")):
            await async_publisher.cancelled(job)
            start = time.perf_counter()
            for _ in range(calls):
                await async_publisher.cancelled(job)
            out[f"asyncio, {label}"] = (time.perf_counter() - start) / calls * 1e6

    asyncio.run(run_async())
    return out


def run(args: argparse.Namespace) -> Report:
    report = Report(messages=args.messages, calls=args.calls)
    with redis_servers() as (streams, pubsub):
        log = args.output.with_suffix(".serve.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        process, base = serve(streams.url, pubsub.url, log)
        try:
            step("latency", f"{args.messages} inputs, one at a time")
            accepted, delivered = _latency(base, streams.url, args.messages)
            for p in (50, 99):
                report.accepted_ms[f"p{p}"] = percentile(accepted, p)
                report.delivered_ms[f"p{p}"] = percentile(delivered, p)
            step("cancellation check", f"{args.calls} calls each")
            report.check_us = _check_cost(base, streams.url, args.calls)
        finally:
            process.terminate()
            process.wait(10)
    return report


def print_report(report: Report) -> None:
    print()
    print(f"control message latency ({report.messages} messages, one at a time)")
    print("| | p50 | p99 |")
    print("|---|---|---|")
    for name, figures in (
        ("POST → 202 (recorded)", report.accepted_ms),
        ("POST → the worker's SDK has it", report.delivered_ms),
    ):
        print(f"| {name} | {figures['p50']} ms | {figures['p99']} ms |")
    print()
    print(f"cancellation check, per call ({report.calls} calls)")
    print("| | µs per call |")
    print("|---|---|")
    for name, value in report.check_us.items():
        print(f"| {name} | {value:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 messages, 2,000 calls")
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--output", type=Path, default=Path("bench/results/control.json"))
    args = parser.parse_args()
    if args.quick:
        args.messages, args.calls = 50, 2_000
    return run_benchmark(run, print_report, args)


if __name__ == "__main__":
    raise SystemExit(main())
