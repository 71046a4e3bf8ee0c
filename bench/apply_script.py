"""What the apply script costs the streams server per event, two source trees side by side.

    .venv/bin/python -m bench.apply_script [--ref REF | --src DIR ...] [--events 20000]
                                           [--jobs 2000] [--rounds 5] [--read-count 100]

The router benchmark's backlog (`bench/backlog.py`) is written to a throwaway `redis-server`,
read back and cut into the batches a router reading `--read-count` entries per shard would
bring (one read of every shard per batch, triaged, encoded and put in judging order as
`RouteBatch` does); then, timed, each batch is applied with one `RedisLuaStateStore.apply`
and nothing else: no reads, acks, publishes or heartbeats. Per tree: the server's CPU per
event (INFO cpu), the client's CPU per event spent in `apply` (building the arguments,
parsing the reply), the time and calls per event of each command (INFO commandstats) and the
verdict counts (the same in every tree, or the trees disagree).

The trees take turns round by round (A B, B A, ...), each round on a fresh server in a
child process run with `PYTHONPATH=<tree>/src`; every figure is the median over the rounds.
`--ref` compares this tree with a commit's `src/` (`git archive`); `--src` names the trees.
`APPLY_BENCH_PERF=<file>` records the server's samples with `perf record -g` for `--child`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _child(events: int, jobs: int, read_count: int, seed: int) -> dict[str, Any]:
    import redis
    import redis.asyncio

    from bench.backlog import FAMILY, GROUP, make_workload
    from eco_router.testing import RedisServer

    try:
        from eco_router.adapters.redis.connections.command_packing import (
            pack_commands_with_hiredis,
        )
    except ImportError:  # a tree from before the router packed its commands with hiredis
        pass
    else:
        # As the router's connections do (`open_client`): the client figures are the router's.
        pack_commands_with_hiredis()
    workload = make_workload(events, jobs, seed)
    server = RedisServer()
    server.start()
    try:
        sync = redis.Redis(port=server.port)
        pipe = sync.pipeline(transaction=False)
        for stream, fields in workload.entries:
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
        pipe.execute()
        for stream in FAMILY.streams:
            sync.xgroup_create(stream, GROUP, id="0")
        batches = read_batches(sync, read_count)
        fence = dict.fromkeys(FAMILY.streams, 0)

        async def run() -> tuple[float, Counter[str]]:
            client = redis.asyncio.Redis(port=server.port)
            store = backlog_store(client)
            await store.apply(batches[0][:1], fence)  # loads the script
            sync.config_resetstat()
            verdicts: Counter[str] = Counter()
            spent = 0.0
            for batch in batches:
                began = time.process_time()
                applied = await store.apply(batch, fence)
                spent += time.process_time() - began
                verdicts.update(str(j.verdict.value) if j else "none" for j in applied.judgements)
            await client.aclose()
            return spent, verdicts

        info_before = sync.info("cpu")
        perf = None
        if os.environ.get("APPLY_BENCH_PERF"):
            perf = subprocess.Popen(
                [
                    "perf",
                    "record",
                    "-g",
                    "-o",
                    os.environ["APPLY_BENCH_PERF"],
                    "-p",
                    str(server.pid),
                ]
            )
            time.sleep(0.5)
        client_s, verdicts = asyncio.run(run())
        info_after = sync.info("cpu")
        if perf is not None:
            perf.send_signal(2)
            perf.wait()
        stats: dict[str, Any] = sync.info("commandstats")
        sync.close()
    finally:
        server.cleanup()
    n = sum(len(b) for b in batches)
    cpu = sum(
        float(info_after[k]) - float(info_before[k]) for k in ("used_cpu_sys", "used_cpu_user")
    )
    return {
        "events": n,
        "batches": len(batches),
        "server_us": cpu * 1e6 / n,
        "client_us": client_s * 1e6 / n,
        "usec": {k.removeprefix("cmdstat_"): int(v["usec"]) / n for k, v in stats.items()},
        "calls": {k.removeprefix("cmdstat_"): int(v["calls"]) / n for k, v in stats.items()},
        "verdicts": dict(sorted(verdicts.items())),
    }


def backlog_store(client: Any, **options: Any) -> Any:
    """The Redis state store the backlog is applied with (a day's state TTL, a week's markers,
    histories of 200), on `client`; `options` as the store takes them."""
    from bench.backlog import FAMILY, GROUP
    from eco_router.adapters.redis.router.state_store import RedisLuaStateStore

    return RedisLuaStateStore(
        client,
        families=[FAMILY],
        group=GROUP,
        state_ttl_s=86_400,
        markers_ttl_s=7 * 86_400,
        history_size=200,
        **options,
    )


def read_batches(sync: Any, read_count: int) -> list[Any]:
    """The backlog's batches as a router reading `read_count` entries per shard brings them:
    one read of every shard per batch, parsed, encoded and put in judging order."""
    from bench.backlog import FAMILY
    from eco_router.adapters.json_codec import OrjsonEventEncoder
    from eco_router.application.port_values import EncodedEvent
    from eco_router.domain.event import JobEvent
    from eco_router.domain.parsing import parse_entry
    from eco_router.domain.verdict import in_judging_order

    read: dict[str, list[tuple[bytes, dict[bytes, bytes]]]] = {
        s: sync.xrange(s) for s in FAMILY.streams
    }
    encoder = OrjsonEventEncoder()
    batches: list[list[EncodedEvent]] = []
    longest = max(len(entries) for entries in read.values())
    for start in range(0, longest, read_count):
        parsed: list[JobEvent] = []
        for stream, entries in read.items():
            for entry_id, raw in entries[start : start + read_count]:
                event = parse_entry(
                    domain=FAMILY.domain,
                    stream=stream,
                    entry_id=entry_id.decode(),
                    fields=raw,
                )
                if isinstance(event, JobEvent):
                    parsed.append(event)
        batches.append([EncodedEvent(e, encoder.encode(e)) for e in in_judging_order(parsed)])
    return batches


def _extract(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", ref, "src"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help="compare this tree with this commit's src/")
    parser.add_argument(
        "--src", action="append", type=Path, help="a tree holding src/ (repeatable)"
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--read-count", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.events, args.jobs, args.read_count, args.seed)))
        return
    with tempfile.TemporaryDirectory(prefix="apply-bench-") as scratch:
        trees: list[tuple[str, Path]] = [("this tree", ROOT)]
        if args.ref:
            trees.append((args.ref, _extract(args.ref, Path(scratch))))
        trees += [(str(src), src) for src in args.src or []]
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for r in range(args.rounds):
            for name, tree in trees[r % len(trees) :] + trees[: r % len(trees)]:
                env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{ROOT}"}
                argv = [sys.executable, "-m", "bench.apply_script", "--child"]
                argv += ["--events", str(args.events), "--jobs", str(args.jobs)]
                argv += ["--read-count", str(args.read_count), "--seed", str(args.seed)]
                done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{name}: exited {done.returncode}\n{done.stderr}")
                results[name].append(json.loads(done.stdout.splitlines()[-1]))
    _report(results)


def _median(values: list[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2]


def _report(results: dict[str, list[dict[str, Any]]]) -> None:
    names = list(results)
    first = results[names[0]][0]
    rounds = len(results[names[0]])
    print(f"{first['events']} events in {first['batches']} batches, median of {rounds} rounds")
    print(f"{'':32}" + "".join(f"{n[:14]:>16}" for n in names))
    rows = [
        ("streams server CPU µs/event", "server_us"),
        ("client CPU in apply µs/event", "client_us"),
    ]
    for label, key in rows:
        med = [_median([r[key] for r in results[n]]) for n in names]
        spread = [
            f"{min(r[key] for r in results[n]):.1f}-{max(r[key] for r in results[n]):.1f}"
            for n in names
        ]
        print(f"{label:32}" + "".join(f"{m:16.2f}" for m in med))
        print(f"{'  min-max':32}" + "".join(f"{s:>16}" for s in spread))
    commands = sorted({c for n in names for r in results[n] for c in r["usec"]})
    print("time per event by command, µs (calls per event)")
    for c in commands:
        cells = []
        for n in names:
            usec = _median([r["usec"].get(c, 0.0) for r in results[n]])
            calls = results[n][0]["calls"].get(c, 0.0)
            cells.append(f"{usec:.2f} ({calls:.2f})")
        print(f"  {c:30}" + "".join(f"{x:>16}" for x in cells))
    for n in names:
        print(f"verdicts {n}: {results[n][0]['verdicts']}")
    if len(names) > 1:
        base = _median([r["server_us"] for r in results[names[1]]])
        this = _median([r["server_us"] for r in results[names[0]]])
        print(f"server CPU per event, {names[0]} / {names[1]}: {this / base:.2f}")


if __name__ == "__main__":
    main()
