"""The read path's goals, each as met or missed by how much, from one router benchmark run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.router_bench import Latency, Report


@dataclass(frozen=True, slots=True)
class Goal:
    """One goal: what is measured, the bound, and which side of it is good."""

    name: str
    bound: float
    at_most: bool
    unit: str = "x"

    def verdict(self, measured: float | None) -> str:
        if measured is None:
            return f"{self.name}: not measured in this run"
        met = measured <= self.bound if self.at_most else measured >= self.bound
        sign = "<=" if self.at_most else ">="
        shown = f"{measured:.2f}{self.unit} (goal {sign} {self.bound:g}{self.unit})"
        if met:
            return f"{self.name}: {shown}: met"
        return f"{self.name}: {shown}: missed by {abs(measured / self.bound - 1) * 100:.0f} %"


def _ratio(key: str) -> Callable[[Report], float | None]:
    return lambda report: report.ratios.get(key)


def _paced_p99(rate: int) -> Callable[[Report], float | None]:
    def p99(report: Report) -> float | None:
        paced: Latency | None = report.rates.get(rate, {}).get("leases")
        if paced is None:
            paced = report.latency.get("leases")
        if paced is None or paced.target_rate != rate:
            return None
        return paced.p99_ms

    return p99


GOALS: Sequence[tuple[Goal, Callable[[Report], float | None]]] = (
    (
        Goal("drain: streams redis CPU per event / plain batch", 1.2, at_most=True),
        _ratio("redis_cpu_leases_over_plain"),
    ),
    (
        Goal("drain: events/s / plain batch", 1.0, at_most=False),
        _ratio("throughput_leases_over_plain"),
    ),
    (
        Goal("drain: events/s / one-at-a-time router", 15.0, at_most=False),
        _ratio("throughput_batched_over_naive"),
    ),
    (
        Goal("paced 1,000 ev/s: router CPU per event / plain batch", 1.0, at_most=True),
        _ratio("paced_1000_router_cpu_leases_over_plain"),
    ),
    (
        Goal("paced 1,000 ev/s: streams redis CPU per event / plain batch", 1.1, at_most=True),
        _ratio("paced_1000_redis_cpu_leases_over_plain"),
    ),
    (Goal("paced 1,000 ev/s: p99", 2.0, at_most=True, unit=" ms"), _paced_p99(1000)),
    (Goal("paced 5,000 ev/s: p99", 3.0, at_most=True, unit=" ms"), _paced_p99(5000)),
)


def goal_lines(report: Report) -> list[str]:
    """One line per goal: the figure of this run, and met or missed by how much."""
    return [goal.verdict(measure(report)) for goal, measure in GOALS]
