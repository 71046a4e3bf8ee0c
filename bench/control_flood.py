"""Control flood: what one viewer's token can make a job's control messages cost.

Run from the repository root: `.venv/bin/python -m bench.control_flood [--quick]` (or
`make bench-control-flood`).

It starts throwaway redis-servers and this tree's `eco-router serve` with a JWT secret, the
console and the default settings, starts one chat job, then:

1. Flood: one viewer's token POSTs `--posts` inputs of 4 KB to the job, one after the other,
   as fast as it can (no worker reads them): the answers by status, the streams Redis's memory
   before and after, the job's control keys, `serve`'s CPU per request, the console's lookup
   of the job (its bytes), and whether a cancel still gets through.
2. Unknown jobs: a token for every job POSTs an input to `--unknown` jobs that have no event:
   the answers by status and the keys left on the streams Redis.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from bench.control_bench import serve, started
from bench.redis_servers import redis_servers
from bench.reporting import run_benchmark, step
from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer
from eco_router.adapters.jwt_authorizer import JwtAuthorizer
from eco_router.adapters.redis.keys import JobKeys
from eco_router.producer import connect, producer_config

SECRET = "a-benchmark-secret-that-is-long-enough-for-hs256"
JOB = "flood-1"
BODY = {"input": "x" * 4000}


@dataclass
class Report:
    posts: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    memory_before_mb: float = 0.0
    memory_after_mb: float = 0.0
    control_log_entries: int = 0
    control_state_fields: int = 0
    serve_cpu_us_per_request: float = 0.0
    console_lookup_bytes: int = 0
    cancel_after: int = 0
    unknown_posts: int = 0
    unknown_statuses: dict[str, int] = field(default_factory=dict)
    unknown_keys_left: int = 0


def _cpu_s(pid: int) -> float:
    """The process's user and system CPU so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory_mb(client: redis.Redis) -> float:
    return int(client.info("memory")["used_memory"]) / 1e6


def run(args: argparse.Namespace) -> Report:
    report = Report(posts=args.posts, unknown_posts=args.unknown)
    viewer = JwtAuthorizer(SECRET).issue("chat", [JOB], ttl_s=3600)
    anyone = JwtAuthorizer(SECRET).issue("chat", ["*"], ttl_s=3600)
    admin = JwtAdminAuthorizer(SECRET).issue(ttl_s=3600)
    settings = {"EVENT_ROUTER_JWT_SECRET": SECRET, "EVENT_ROUTER_CONSOLE": "true"}
    with redis_servers() as (streams, pubsub), redis.Redis.from_url(streams.url) as client:
        log = args.output.with_suffix(".serve.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        process, base = serve(streams.url, pubsub.url, log, settings)
        try:
            publisher = connect(streams.url, producer_config(domain="chat", shards=4))
            started(publisher, streams.url, JOB)
            headers = {"Authorization": f"Bearer {viewer}"}
            with httpx.Client(base_url=base, trust_env=False, timeout=30) as http:
                step("flood", f"{args.posts} inputs of 4 KB from one viewer")
                report.memory_before_mb = _memory_mb(client)
                cpu = _cpu_s(process.pid)
                statuses: Counter[str] = Counter()
                for n in range(args.posts):
                    answer = http.post(
                        f"/api/v1/chat/{JOB}/input",
                        json=BODY,
                        headers=headers | {"Idempotency-Key": f"r{n}"},
                    )
                    statuses[str(answer.status_code)] += 1
                report.serve_cpu_us_per_request = (_cpu_s(process.pid) - cpu) / args.posts * 1e6
                report.statuses = dict(statuses)
                report.memory_after_mb = _memory_mb(client)
                keys = JobKeys.in_family(producer_config(domain="chat", shards=4).family, JOB)
                report.control_log_entries = int(client.xlen(keys.control))
                report.control_state_fields = int(client.hlen(keys.control_state))
                lookup = http.get(
                    f"/console/api/jobs/chat/{JOB}", headers={"Authorization": f"Bearer {admin}"}
                )
                report.console_lookup_bytes = len(lookup.content)
                stop = http.post(
                    f"/api/v1/chat/{JOB}/cancel", headers=headers | {"Idempotency-Key": "stop"}
                )
                report.cancel_after = stop.status_code

                step("unknown jobs", f"{args.unknown} inputs to jobs without events")
                keys_before = int(client.dbsize())
                unknown: Counter[str] = Counter()
                for n in range(args.unknown):
                    answer = http.post(
                        f"/api/v1/chat/never-{n}/input",
                        json={"input": "x"},
                        headers={"Authorization": f"Bearer {anyone}", "Idempotency-Key": "k"},
                    )
                    unknown[str(answer.status_code)] += 1
                time.sleep(0.5)
                report.unknown_statuses = dict(unknown)
                report.unknown_keys_left = int(client.dbsize()) - keys_before
        finally:
            process.terminate()
            process.wait(10)
    return report


def print_report(report: Report) -> None:
    print()
    print(f"one viewer's flood: {report.posts} inputs of 4 KB to one job, no worker reading")
    print("| | figure |")
    print("|---|---|")
    statuses = ", ".join(f"{s}: {n}" for s, n in sorted(report.statuses.items()))
    print(f"| answers | {statuses} |")
    print(
        f"| streams Redis used_memory | {report.memory_before_mb:.1f} MB before, "
        f"{report.memory_after_mb:.1f} MB after |"
    )
    print(
        f"| the job's control log / state hash | {report.control_log_entries} entries / "
        f"{report.control_state_fields} fields |"
    )
    print(f"| serve CPU per request | {report.serve_cpu_us_per_request:.0f} µs |")
    print(f"| console lookup of the job | {report.console_lookup_bytes} bytes |")
    print(f"| a cancel after the flood | {report.cancel_after} |")
    print()
    print(f"messages to jobs without events: {report.unknown_posts} posts")
    statuses = ", ".join(f"{s}: {n}" for s, n in sorted(report.unknown_statuses.items()))
    print(f"| answers | {statuses} |")
    print(f"| keys left on the streams Redis | {report.unknown_keys_left} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 inputs, 200 unknown jobs")
    parser.add_argument("--posts", type=int, default=10_000)
    parser.add_argument("--unknown", type=int, default=2_000)
    parser.add_argument("--output", type=Path, default=Path("bench/results/control_flood.json"))
    args = parser.parse_args()
    if args.quick:
        args.posts, args.unknown = 1_000, 200
    return run_benchmark(run, print_report, args)


if __name__ == "__main__":
    raise SystemExit(main())
