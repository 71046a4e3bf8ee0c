"""This tree's gateway against another commit's, in alternating rounds: on a machine busy with
other work, one long run of each drifts apart; rounds taken in turn (A B, B A, A B, ...)
share the drift, and their medians compare.

Run from the repository root: `.venv/bin/python -m bench.alternating_rounds [--rounds 4]`.

Each round, for each column, on fresh gateways (the servers and the routing worker are
shared):
- opening: `--connections` streams, each on its own job: opens/s, the gateway's CPU per open
  (process CPU, steadier than the rate on a busy machine), RSS per connection;
- fan-out: `--viewers` viewers of one job, `--fanout-rate` events/s for `--seconds`: frames/s
  delivered, the share delivered, gateway CPU per frame, latency p99.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack

import uvloop

from bench.baseline_source import baseline_source
from bench.gateway_processes import (
    DOMAIN,
    Column,
    Gateway,
    open_files_for,
    ready_gateway,
    routed_servers,
)
from bench.sse_bench import Result, fan_out, rss_warmed_up
from bench.sse_client import Tally, open_connections

SETTLE_S = 1.0
FIGURES = (
    ("opens/s", "{:,.0f}"),
    ("gateway ms per open", "{:.3f}"),
    ("KiB per connection", "{:.2f}"),
    ("frames/s", "{:,.0f}"),
    ("share delivered", "{:.3f}"),
    ("gateway us per frame", "{:.1f}"),
    ("fan-out p99 ms", "{:,.0f}"),
)


async def opening(gateway: Gateway, connections: int) -> dict[str, float]:
    run_id = f"{time.time_ns():x}"
    before = await rss_warmed_up(gateway, run_id)
    jobs = [f"job-{run_id}-{n:05d}" for n in range(connections)]
    cpu, started = gateway.cpu_seconds(), time.monotonic()
    opened, failures = await open_connections(gateway.port, DOMAIN, jobs, Tally(), probes=0)
    elapsed = time.monotonic() - started
    cpu = gateway.cpu_seconds() - cpu
    await asyncio.sleep(SETTLE_S)
    rss = gateway.rss_kib()
    for connection in opened:
        connection.close()
    if failures:
        print(f"  failures: {dict(failures)}")
    count = max(1, len(opened))
    return {
        "opens/s": len(opened) / elapsed,
        "gateway ms per open": 1000 * cpu / count,
        "KiB per connection": (rss - before) / count,
    }


def fanning_out(gateway: Gateway, streams_url: str, args: argparse.Namespace) -> dict[str, float]:
    result = Result("")
    uvloop.run(fan_out(gateway, streams_url, args, result))
    return {
        "frames/s": result.fanout_frames_per_s,
        "share delivered": result.fanout_frames / max(1, result.fanout_frames_expected),
        "gateway us per frame": result.fanout_cpu_us_per_frame or 0.0,
        "fan-out p99 ms": result.fanout_p99_ms or 0.0,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.alternating_rounds")
    parser.add_argument("--baseline-ref", default="main", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=3_000)
    parser.add_argument("--viewers", type=int, default=2_000)
    parser.add_argument("--fanout-rate", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=8.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    fds = open_files_for(max(args.connections, args.viewers))
    with ExitStack() as stack:
        source = stack.enter_context(baseline_source(args.baseline_ref, None))
        columns = [Column("this tree"), Column(f"baseline {source.commit}", source=source)]
        rounds: dict[str, list[dict[str, float]]] = {c.title: [] for c in columns}
        with routed_servers(max(args.connections, args.viewers)) as (streams, pubsub):
            for n in range(args.rounds):
                for column in columns if n % 2 == 0 else columns[::-1]:
                    with ready_gateway(column, streams, pubsub, fds=fds) as gateway:
                        figures = uvloop.run(opening(gateway, args.connections))
                    with ready_gateway(column, streams, pubsub, fds=fds) as gateway:
                        figures |= fanning_out(gateway, streams.url, args)
                    rounds[column.title].append(figures)
                    shown = "  ".join(
                        f"{name} {fmt.format(figures[name])}" for name, fmt in FIGURES
                    )
                    print(f"round {n + 1} {column.title}: {shown}", flush=True)
    print(f"\nmedians of {args.rounds} rounds")
    for name, fmt in FIGURES:
        medians = [fmt.format(statistics.median(r[name] for r in rounds[c])) for c in rounds]
        print(f"  {name:<24}" + "".join(f"{m:>20}" for m in medians))
    print(f"  {'':<24}" + "".join(f"{c:>20}" for c in rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
