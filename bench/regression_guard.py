"""Which figures of a benchmark run moved beyond the noise from the recorded ones.

    .venv/bin/python -m bench.regression_guard [RESULTS] [--recorded RECORDED]

`make bench` runs it after the benchmark: RESULTS is the run's JSON (bench/results/router.json),
RECORDED the figures kept in the repository (bench/recorded/router.json, replaced on purpose
with `make bench-record`). A figure moved when it changed by more than its noise: the spread
its own rounds showed (in the run or in the record, whichever is wider), at least a fixed
share; ratios between columns of one run move least and are compared
too. The guard reports; it never fails the run (the machine may just be busier).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).parent
RESULTS = BENCH_DIR / "results" / "router.json"
RECORDED = BENCH_DIR / "recorded" / "router.json"

# Absolute figures of two runs move by this much with the machine alone; wider when the
# rounds of either run spread wider.
DEFAULT_NOISE = 0.20
RATIO_NOISE = 0.15
# (section, figure, spread of its rounds); higher is better for events/s only.
FIGURES: tuple[tuple[str, str, str | None], ...] = (
    ("throughput", "events_per_s", "runs_events_per_s"),
    ("throughput", "redis_cpu_us_per_event", "runs_redis_cpu_us_per_event"),
    ("throughput", "pubsub_cpu_us_per_event", None),
    ("throughput", "worker_cpu_us_per_event", None),
    ("latency", "p50_ms", "runs_p50_ms"),
    ("latency", "p99_ms", "runs_p99_ms"),
)
HIGHER_IS_BETTER = frozenset({"events_per_s"})


@dataclass(frozen=True, slots=True)
class Change:
    name: str
    recorded: float
    now: float
    noise: float
    better_when_higher: bool

    @property
    def change(self) -> float:
        return self.now / self.recorded - 1

    @property
    def moved(self) -> bool:
        return abs(self.change) > self.noise

    @property
    def verdict(self) -> str:
        if not self.moved:
            return "within noise"
        improved = (self.change > 0) == self.better_when_higher
        return "better" if improved else "WORSE"


def compare(now: Mapping[str, Any], recorded: Mapping[str, Any]) -> list[Change]:
    """Every figure both runs have, with its noise."""
    return [*_column_figures(now, recorded), *_ratios(now, recorded)]


def _column_figures(now: Mapping[str, Any], recorded: Mapping[str, Any]) -> Iterator[Change]:
    for section, figure, runs in FIGURES:
        columns_now = now.get(section) or {}
        columns_then = recorded.get(section) or {}
        for column in sorted(columns_now.keys() & columns_then.keys()):
            a, b = columns_then[column], columns_now[column]
            if not _usable(a.get(figure)) or not _usable(b.get(figure)):
                continue
            noise = max(DEFAULT_NOISE, _spread(a, runs), _spread(b, runs))
            yield Change(
                f"{section} {column} {figure}",
                float(a[figure]),
                float(b[figure]),
                noise,
                figure in HIGHER_IS_BETTER,
            )


def _ratios(now: Mapping[str, Any], recorded: Mapping[str, Any]) -> Iterator[Change]:
    ratios_now, ratios_then = now.get("ratios") or {}, recorded.get("ratios") or {}
    for name in sorted(ratios_now.keys() & ratios_then.keys()):
        if _usable(ratios_now[name]) and _usable(ratios_then[name]):
            higher = name.startswith("throughput")
            yield Change(f"ratio {name}", ratios_then[name], ratios_now[name], RATIO_NOISE, higher)


def _spread(column: Mapping[str, Any], runs: str | None) -> float:
    """Half the relative range of a column's rounds (0 without at least two)."""
    values: list[float] = [v for v in (column.get(runs) or []) if _usable(v)] if runs else []
    if len(values) < 2:
        return 0.0
    middle = sorted(values)[(len(values) - 1) // 2]
    return (max(values) - min(values)) / 2 / middle


def _usable(value: object) -> bool:
    return isinstance(value, (int, float)) and value > 0 and value != float("inf")


def report(changes: Sequence[Change], *, same_config: bool) -> list[str]:
    lines = []
    if not same_config:
        lines.append(
            "note: the recorded run used other settings (quick vs full, sizes): compare with care"
        )
    moved = [c for c in changes if c.moved]
    for c in moved:
        lines.append(
            f"  {c.verdict:>6}: {c.name}: {_num(c.recorded)} -> {_num(c.now)} "
            f"({c.change:+.0%}, noise ±{c.noise:.0%})"
        )
    lines.append(
        f"{len(moved)} of {len(changes)} figures moved beyond the noise "
        f"({sum(c.verdict == 'WORSE' for c in moved)} worse)"
    )
    return lines


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.regression_guard", description=__doc__)
    parser.add_argument("results", nargs="?", type=Path, default=RESULTS)
    parser.add_argument("--recorded", type=Path, default=RECORDED)
    args = parser.parse_args(argv)
    if not args.recorded.exists():
        print(f"no recorded figures at {args.recorded}: `make bench-record` keeps this run's")
        return 0
    now = json.loads(args.results.read_text())
    recorded = json.loads(args.recorded.read_text())
    print(f"against the recorded figures of {recorded.get('generated_at', '?')}:")
    same = now.get("config") == recorded.get("config")
    for line in report(compare(now, recorded), same_config=same):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
