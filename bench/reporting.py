"""What the benchmarks share: progress lines, percentiles, table rows, the environment, the
report of columns, the JSON result file."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

RowPrinter = Callable[[str, Sequence[str]], None]


class Titled(Protocol):
    """A column of a table: its title heads it."""

    @property
    def title(self) -> str: ...


R = TypeVar("R")
C = TypeVar("C", bound=Titled)

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


def num(value: float | None, fmt: str = "{:,.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def row_printer(label_width: int, column_width: int) -> RowPrinter:
    """A printer of table rows: the label, then one right-aligned cell per column."""

    def row(label: str, values: Sequence[str]) -> None:
        print(f"{label:<{label_width}}" + "".join(f"{v:>{column_width}}" for v in values))

    return row


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


@dataclass(slots=True)
class ColumnsReport(Generic[C]):
    """A run that compares columns side by side: its arguments, its columns, the machine."""

    args: dict[str, Any]
    columns: list[C]
    environment: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, args: argparse.Namespace, columns: list[C]) -> ColumnsReport[C]:
        return cls({k: str(v) for k, v in vars(args).items()}, columns, environment())

    def print_head(self, headline: str, *, label_width: int, column_width: int) -> RowPrinter:
        """Print the table's head (`headline` with the machine, then the columns' titles); the
        printer of its rows, aligned under it."""
        row = row_printer(label_width, column_width)
        print()
        print(f"{headline} {self.environment['cpus']} CPUs, Python {self.environment['python']}")
        row("", [column.title for column in self.columns])
        return row


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
