"""How the router scales: events/s and Redis CPU per event by batch size and by shard count,
and the worker's memory over a long run of many jobs.

    .venv/bin/python -m bench.scaling_curve [--quick] [--only batch|shards|memory]

Each drain is one router (this tree's worker, default settings but for the one varied) on a
fresh standalone redis-server, as the topology section of `bench.router_bench` measures it;
columns are interleaved round by round and each figure is the median over the rounds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.backlog import FAMILY, make_workload
from bench.redis_servers import redis_servers
from bench.reporting import RESULTS_DIR, environment, run_benchmark, step
from bench.routers import BATCHED_READ_COUNT, RouterKind, wait_until_reading
from bench.topologies import Standalone
from bench.topology_drain import TopologyDrain, measure_topology_drain, median_topology_drain
from eco_router.testing import RedisServer

RESULTS_PATH = RESULTS_DIR / "scaling.json"
BATCH_SIZES = (1, 10, 100, 1_000)
SHARD_COUNTS = (1, 2, 4, 8)
FULL = {"events": 20_000, "jobs": 2_000, "repeats": 3, "memory_events": 1_000_000}
QUICK = {"events": 5_000, "jobs": 500, "repeats": 1, "memory_events": 100_000}
# Jobs of the memory run: every 10 events one job is done and another starts.
EVENTS_PER_JOB = 10
MEMORY_SAMPLES = 5
MEMORY_BATCH = 10_000


@dataclass(slots=True)
class Report:
    config: dict[str, Any]
    environment: dict[str, Any] = field(default_factory=environment)
    batch: dict[str, TopologyDrain] = field(default_factory=dict)
    shards: dict[str, TopologyDrain] = field(default_factory=dict)
    memory: list[dict[str, float]] = field(default_factory=list)


def _kind(read_count: int, shards: int) -> RouterKind:
    return RouterKind(
        f"count{read_count}_shards{shards}",
        f"COUNT {read_count}, {shards} shards",
        read_count,
        settings=(("EVENT_ROUTER_STREAMS", f"{FAMILY.prefix}={shards}"),),
    )


def _curve(
    columns: Sequence[tuple[str, int, int]], *, events: int, jobs: int, repeats: int, seed: int
) -> dict[str, TopologyDrain]:
    """Drains of the same entries by each (label, read count, shards) column."""
    runs: dict[str, list[TopologyDrain]] = {label: [] for label, _, _ in columns}
    for round_ in range(repeats):
        for label, read_count, shards in [*columns[round_:], *columns[:round_]]:
            topology = Standalone(shards)
            workload = make_workload(events, jobs, seed, topology.family)
            with topology, RedisServer() as pubsub:
                drain = measure_topology_drain(
                    topology, pubsub, kind=_kind(read_count, shards), workload=workload
                )
            runs[label].append(drain)
            step(
                f"round {round_ + 1}/{repeats}",
                f"{label}: {drain.events_per_s:,.0f} ev/s, streams "
                f"{drain.masters_cpu_us_per_event:.1f} us/event, router "
                f"{drain.worker_cpu_us_per_event:.1f} us/event",
            )
    return {label: median_topology_drain(r) for label, r in runs.items()}


def measure_memory(total_events: int, seed: int) -> list[dict[str, float]]:
    """Feed one worker `total_events` in batches, a new job every few events, and sample its
    RSS and the streams server's memory as the events go by."""
    del seed  # the entries are regular: every job publishes the same stages
    samples: list[dict[str, float]] = []
    every = max(MEMORY_BATCH, total_events // MEMORY_SAMPLES)
    with redis_servers() as (streams, pubsub):
        client = redis.Redis.from_url(streams.url)
        kind = _kind(BATCHED_READ_COUNT, FAMILY.shards)
        with kind.spawn(streams.url, pubsub.url, name="bench-memory") as worker:
            wait_until_reading(client, [worker], family=FAMILY, servers=[client])
            samples.append(_memory_sample(0, 0, worker.rss_kib(), client))
            written = 0
            started = time.monotonic()
            while written < total_events:
                _write_jobs(client, written, MEMORY_BATCH)
                written += MEMORY_BATCH
                # Drained batch by batch: the streams are trimmed (MAXLEN ~10,000), so a
                # larger backlog would lose entries before the router reads them.
                _wait_drained(client, written)
                if written % every == 0 or written >= total_events:
                    sample = _memory_sample(
                        written, written // EVENTS_PER_JOB, worker.rss_kib(), client
                    )
                    samples.append(sample)
                    step(
                        "memory",
                        f"{written:,} events, {sample['jobs']:,.0f} jobs: worker "
                        f"{sample['worker_rss_mib']:.1f} MiB, streams redis "
                        f"{sample['redis_used_mib']:.1f} MiB "
                        f"({time.monotonic() - started:.0f} s)",
                    )
        client.close()
    return samples


def _write_jobs(client: redis.Redis, first_event: int, count: int) -> None:
    pipe = client.pipeline(transaction=False)
    for n in range(first_event, first_event + count):
        job = f"mem-{n // EVENTS_PER_JOB}"
        seq = n % EVENTS_PER_JOB
        stream = FAMILY.stream_for(job)
        fields = {"job_id": job, "seq": str(seq), "stage": f"s{seq}", "status": "completed"}
        if seq == EVENTS_PER_JOB - 1:
            fields |= {"stage": "done", "status": "done", "result": '{"ok":true}'}
        pipe.xadd(stream, fields, maxlen=10_000, approximate=True)  # type: ignore[arg-type]
    pipe.execute()


def _wait_drained(client: redis.Redis, written: int, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        groups = [client.xinfo_groups(s) for s in FAMILY.streams]
        if all(g and g[0]["lag"] == 0 and g[0]["pending"] == 0 for g in groups):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the worker did not route {written:,} events in {timeout_s:.0f} s")


def _memory_sample(events: int, jobs: int, rss_kib: int, client: redis.Redis) -> dict[str, float]:
    info = client.info("memory")
    keys = client.dbsize()
    return {
        "events": events,
        "jobs": jobs,
        "worker_rss_mib": rss_kib / 1024,
        "redis_used_mib": int(info["used_memory"]) / 2**20,
        "redis_keys": keys,
    }


def run(args: argparse.Namespace) -> Report:
    sizes = QUICK if args.quick else FULL
    report = Report(config={"quick": args.quick, **sizes})
    common = {"events": sizes["events"], "jobs": sizes["jobs"], "repeats": sizes["repeats"]}
    if args.only in (None, "batch"):
        step("batch size", f"COUNT {', '.join(map(str, BATCH_SIZES))} per shard read, 4 shards")
        columns = [(f"COUNT {n}", n, FAMILY.shards) for n in BATCH_SIZES]
        report.batch = _curve(columns, seed=args.seed, **common)
    if args.only in (None, "shards"):
        step("shards", f"{', '.join(map(str, SHARD_COUNTS))} shards, COUNT 100")
        columns = [(f"{n} shards", BATCHED_READ_COUNT, n) for n in SHARD_COUNTS]
        report.shards = _curve(columns, seed=args.seed, **common)
    if args.only in (None, "memory"):
        report.memory = measure_memory(sizes["memory_events"], args.seed)
    return report


def print_report(report: Report) -> None:
    print()
    env = report.environment
    print(
        f"eco-router scaling: {env['cpus']} CPUs, Python {env['python']}; one router on a fresh "
        "standalone redis-server per drain; medians over the rounds"
    )
    sections = (("BATCH SIZE (4 shards)", report.batch), ("SHARDS (COUNT 100)", report.shards))
    for title, drains in sections:
        if not drains:
            continue
        print(f"\n{title}")
        print(
            f"{'':>14} {'events/s':>10} {'streams us/ev':>14} {'pubsub us/ev':>13} "
            f"{'router us/ev':>13} {'mean batch':>11}"
        )
        for label, d in drains.items():
            batch = "n/a" if d.mean_batch_size is None else f"{d.mean_batch_size:.1f}"
            print(
                f"{label:>14} {d.events_per_s:>10,.0f} {d.masters_cpu_us_per_event:>14.1f} "
                f"{d.pubsub_cpu_us_per_event:>13.1f} {d.worker_cpu_us_per_event:>13.1f} "
                f"{batch:>11}"
            )
    if report.memory:
        print("\nMEMORY (one worker, every job done after 10 events)")
        print(f"{'events':>10} {'jobs':>9} {'worker RSS MiB':>15} {'redis MiB':>10} {'keys':>9}")
        for s in report.memory:
            print(
                f"{s['events']:>10,.0f} {s['jobs']:>9,.0f} {s['worker_rss_mib']:>15.1f} "
                f"{s['redis_used_mib']:>10.1f} {s['redis_keys']:>9,.0f}"
            )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling_curve", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller runs, one round")
    parser.add_argument("--only", choices=("batch", "shards", "memory"), default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(run, print_report, parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
