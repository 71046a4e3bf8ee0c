"""CPU the `eco-router` command spends to start and do one small thing.

    .venv/bin/python -m bench.cli_startup [--runs 10] [--src DIR] [--goal-ms 200]

Runs each command `--runs` times, one subprocess after another, and reports user + system
CPU per run (`resource.getrusage(RUSAGE_CHILDREN)` before and after each command's runs):
`--version`, `publish` and `status` against a throwaway `redis-server` started on a free
loopback port (never a server it did not start), `state` of that job, and `token`. A row
for `python -c pass` gives the interpreter's own floor. `--src DIR` runs another tree's
`src` directory instead (e.g. an earlier commit from `git archive <ref> src | tar -x -C DIR`)
to compare before and after on one machine in one run. The goal is met when every
command of `--version`, `publish` and `status` stays under `--goal-ms`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from eco_router.testing import RedisServer

GOAL_COMMANDS = ("--version", "publish", "status")
SECRET = "a-bench-secret-of-at-least-32-bytes!"


def commands() -> dict[str, list[str]]:
    """Name → arguments, in the order they are reported."""
    return {
        "--version": ["--version"],
        "publish": ["publish", "--job", "bench-1", "--stage", "vision", "--status", "started"],
        "status": ["status"],
        "state": ["state", "bench-1"],
        "token": ["token", "--job", "bench-1"],
    }


def cpu_ms_per_run(
    argv: Sequence[str], env: dict[str, str], runs: int, *, ok: frozenset[int] = frozenset({0})
) -> tuple[float, float]:
    """Mean user + system CPU ms of `argv` over `runs` runs, and the median wall ms."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    walls = []
    for _ in range(runs):
        started = _now()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        walls.append((_now() - started) * 1000)
        if done.returncode not in ok:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu_s * 1000 / runs, statistics.median(walls)


def _now() -> float:
    return os.times().elapsed


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command")
    parser.add_argument("--src", type=Path, help="another tree's src directory to measure")
    parser.add_argument("--goal-ms", type=float, default=200.0, help="CPU ms per command")
    options = parser.parse_args(args)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ROUTER_", "REDIS_"))}
    if options.src is not None:
        env["PYTHONPATH"] = str(options.src.resolve())
    cli = [sys.executable, "-m", "eco_router.entrypoints.cli"]
    with RedisServer() as server:
        env.update(REDIS_STREAMS_URL=server.url, EVENT_ROUTER_JWT_SECRET=SECRET)
        # One publish first: the job `state` reads exists, and the .pyc files are written.
        cpu_ms_per_run([*cli, *commands()["publish"]], env, 1)
        rows = [("python -c pass", *cpu_ms_per_run([sys.executable, "-c", "pass"], env, 3))]
        for name, argv in commands().items():
            try:
                # `state` of a job no router has routed (none runs here) exits 1.
                ok = frozenset({0, 1}) if name == "state" else frozenset({0})
                rows.append((name, *cpu_ms_per_run([*cli, *argv], env, options.runs, ok=ok)))
            except SystemExit as failed:
                print(f"{name}: not measured ({str(failed).splitlines()[0]})", file=sys.stderr)

    tree = options.src or Path(__file__).resolve().parents[1] / "src"
    print(f"eco-router start-up, {options.runs} runs each, tree {tree}")
    print(f"{'command':<16} {'CPU ms/run':>10} {'wall ms':>8}  goal")
    met = True
    for name, cpu, wall in rows:
        mark = ""
        if name in GOAL_COMMANDS:
            ok = cpu < options.goal_ms
            met &= ok
            mark = "ok" if ok else f"over {options.goal_ms:.0f}"
        print(f"{name:<16} {cpu:>10.0f} {wall:>8.0f}  {mark}")
    verdict = "met" if met else "NOT met"
    print(f"goal ({', '.join(GOAL_COMMANDS)} under {options.goal_ms:.0f} ms of CPU): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
