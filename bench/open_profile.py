"""Where the gateway's CPU per opened stream goes: `serve --no-router` under cProfile while
`--connections` clients each open a stream of their own job.

Run from the repository root: `.venv/bin/python -m bench.open_profile [--connections 3000]`.

It prints the opens/s, the gateway's and this client's CPU per open (a client that used far
less than a core was not what bounded the rate), then the functions with the most CPU of the
gateway (cProfile's own and cumulative time; cProfile slows every call, so read the shares).
"""

from __future__ import annotations

import argparse
import asyncio
import pstats
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

from bench.gateway_processes import DOMAIN, Column, Gateway, open_files_for, routed_servers
from bench.sse_client import Tally, open_connections


async def open_all(gateway: Gateway, connections: int) -> dict[str, float]:
    jobs = [f"open-{time.time_ns():x}-{n:05d}" for n in range(connections)]
    cpu, client_cpu, started = gateway.cpu_seconds(), time.process_time(), time.monotonic()
    opened, failures = await open_connections(gateway.port, DOMAIN, jobs, Tally(), probes=0)
    elapsed = time.monotonic() - started
    figures = {
        "opened": len(opened),
        "opens/s": len(opened) / elapsed,
        "gateway ms per open": 1000 * (gateway.cpu_seconds() - cpu) / max(1, len(opened)),
        "client ms per open": 1000 * (time.process_time() - client_cpu) / max(1, len(opened)),
        "client share of a core": (time.process_time() - client_cpu) / elapsed,
    }
    if failures:
        print(f"failures: {dict(failures)}")
    for connection in opened:
        connection.close()
    await asyncio.sleep(1)
    return figures


def parse_args(argv: Sequence[str] | None) -> Any:
    parser = argparse.ArgumentParser(prog="python -m bench.open_profile")
    parser.add_argument("--connections", type=int, default=3_000)
    parser.add_argument("--top", type=int, default=30)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    fds = open_files_for(args.connections)
    with tempfile.TemporaryDirectory() as scratch:
        profile = Path(scratch) / "gateway.prof"
        with (
            routed_servers(args.connections) as (streams, pubsub),
            Gateway(
                Column("this tree"), streams.url, pubsub.url, fds=fds, profile_to=profile
            ) as gateway,
        ):
            gateway.wait_ready()
            figures = uvloop.run(open_all(gateway, args.connections))
        for name, value in figures.items():
            print(f"{name:>24}: {value:,.2f}")
        stats = pstats.Stats(str(profile))
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats("eco_router", args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
