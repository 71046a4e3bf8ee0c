"""CPU the `eco-router` command spends to start and do one small thing.

    .venv/bin/python -m bench.cli_startup [--runs 10] [--src DIR ...] [--goal-ms 200]

Runs each command `--runs` times, one subprocess after another, and reports user + system
CPU per run (`resource.getrusage(RUSAGE_CHILDREN)` before and after each command's runs):
`--version`, `publish` and `status` against a throwaway `redis-server` started on a free
loopback port (never a server it did not start), `state` of that job, and `token`. A row
for `python -c pass` gives the interpreter's own floor. `--src DIR` runs another tree's
`src` directory instead (e.g. an earlier commit from `git archive <ref> src | tar -x -C DIR`);
given more than once, the trees take turns run by run, to compare before and after on one
machine in one run. The goal is met when every command of `--version`, `publish` and
`status` stays under `--goal-ms`.
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
    parser.add_argument(
        "--src",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a tree's src directory to measure instead of this one; repeat it to compare "
        "trees, their runs taking turns",
    )
    parser.add_argument("--goal-ms", type=float, default=200.0, help="CPU ms per command")
    options = parser.parse_args(args)
    trees = [tree.resolve() for tree in options.src] or [
        Path(__file__).resolve().parents[1] / "src"
    ]

    base = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ROUTER_", "REDIS_"))}
    # Installed, the CLI runs from byte-code (pip and the image compile it); the first publish
    # below writes it, unless PYTHONDONTWRITEBYTECODE is set, when every run would compile
    # the project's modules again (some 40 ms of CPU on 2 cores).
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    cli = [sys.executable, "-m", "eco_router.entrypoints.cli"]
    cpu: dict[tuple[str, Path], list[float]] = {}
    wall: dict[tuple[str, Path], list[float]] = {}
    with RedisServer() as server:
        base.update(REDIS_STREAMS_URL=server.url, EVENT_ROUTER_JWT_SECRET=SECRET)
        envs = {tree: {**base, "PYTHONPATH": str(tree)} for tree in trees}
        for env in envs.values():
            # One publish first: the job `state` reads exists, and the .pyc files are written.
            cpu_ms_per_run([*cli, *commands()["publish"]], env, 1)
        floor = cpu_ms_per_run([sys.executable, "-c", "pass"], base, 3)
        for name, argv in commands().items():
            # `state` of a job no router has routed (none runs here) exits 1.
            ok = frozenset({0, 1}) if name == "state" else frozenset({0})
            for _ in range(options.runs):
                # Turn by turn, so a change in the machine's load falls on every tree alike.
                for tree, env in envs.items():
                    if (name, tree) in cpu and not cpu[name, tree]:
                        continue  # failed before: reported once
                    try:
                        ms, wall_ms = cpu_ms_per_run([*cli, *argv], env, 1, ok=ok)
                    except SystemExit as failed:
                        print(f"{name} ({tree}): not measured ({str(failed).splitlines()[0]})")
                        cpu[name, tree] = []
                        continue
                    cpu.setdefault((name, tree), []).append(ms)
                    wall.setdefault((name, tree), []).append(wall_ms)

    print(f"eco-router start-up, {options.runs} runs each: CPU ms per run (median wall ms)")
    for number, tree in enumerate(trees, 1):
        print(f"  tree {number}: {tree}")
    print(f"{'command':<16}" + "".join(f"{f'tree {n}':>18}" for n in range(1, len(trees) + 1)))
    print(f"{'python -c pass':<16}{_cell(floor[0], floor[1], ''):>18}")
    met = dict.fromkeys(trees, True)
    for name in commands():
        cells = []
        for tree in trees:
            if not cpu.get((name, tree)):
                cells.append("-")
                continue
            ms = statistics.fmean(cpu[name, tree])
            mark = ""
            if name in GOAL_COMMANDS:
                mark = "ok" if ms < options.goal_ms else "over"
                met[tree] &= ms < options.goal_ms
            cells.append(_cell(ms, statistics.median(wall[name, tree]), mark))
        print(f"{name:<16}" + "".join(f"{cell:>18}" for cell in cells))
    goal = f"{', '.join(GOAL_COMMANDS)} under {options.goal_ms:.0f} ms of CPU"
    for number, tree in enumerate(trees, 1):
        print(f"goal ({goal}), tree {number}: {'met' if met[tree] else 'NOT met'}")
    return 0


def _cell(cpu_ms: float, wall_ms: float, mark: str) -> str:
    return f"{cpu_ms:.0f} ({wall_ms:.0f}){f' {mark}' if mark else ''}"


if __name__ == "__main__":
    sys.exit(main())
