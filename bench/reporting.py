"""What the benchmarks share: progress lines, percentiles, the environment, the JSON result file."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R")

RESULTS_DIR = Path(__file__).parent / "results"


def step(title: str, detail: str) -> None:
    print(f"-- {title}: {detail}", flush=True)


def percentile(ranked: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of sorted values; None (not measured) when there are none."""
    if not ranked:
        return None
    value = ranked[max(0, math.ceil(p / 100 * len(ranked)) - 1)]
    return None if math.isinf(value) else round(value, 2)


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def write_json(report: Any, path: Path) -> None:
    """The report dataclass as JSON, stamped with the time it was made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = asdict(report)
    payload["generated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.write_text(json.dumps(payload, indent=2) + "\n")


def environment() -> dict[str, Any]:
    """The machine and interpreter the figures were taken on."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def run_benchmark(
    run: Callable[[argparse.Namespace], R],
    print_report: Callable[[R], None],
    args: argparse.Namespace,
) -> int:
    """Run a benchmark, print its table, write its JSON to `args.output`; the exit code, 0.

    The figures are the outcome: a benchmark that ran to its end has no verdict to fail on.
    """
    started = time.monotonic()
    report = run(args)
    print_report(report)
    write_json(report, args.output)
    print(f"wrote {args.output} ({time.monotonic() - started:.0f} s in all)")
    return 0
