"""The benchmark's regression guard: which figures moved beyond the noise."""

from __future__ import annotations

from typing import Any

from bench.regression_guard import compare, report


def _run(events_per_s: list[float], p99_ms: float, ratio: float) -> dict[str, Any]:
    median = sorted(events_per_s)[(len(events_per_s) - 1) // 2]
    return {
        "config": {"quick": False},
        "throughput": {
            "leases": {
                "events_per_s": median,
                "runs_events_per_s": events_per_s,
                "redis_cpu_us_per_event": 14.0,
            }
        },
        "latency": {"leases": {"p50_ms": 2.5, "p99_ms": p99_ms, "runs_p99_ms": [p99_ms]}},
        "ratios": {"throughput_leases_over_no_check": ratio},
    }


def _moved(now: dict[str, Any], then: dict[str, Any]) -> dict[str, str]:
    return {c.name: c.verdict for c in compare(now, then) if c.moved}


def test_a_figure_beyond_its_noise_is_named_with_its_direction() -> None:
    recorded = _run([27_000, 27_000, 27_000], p99_ms=6.0, ratio=1.0)
    now = _run([15_000, 15_500, 16_000], p99_ms=6.2, ratio=0.7)

    assert _moved(now, recorded) == {
        "throughput leases events_per_s": "WORSE",
        "ratio throughput_leases_over_no_check": "WORSE",
    }


def test_changes_within_the_spread_of_the_rounds_are_noise() -> None:
    # The rounds of the run spread by ±40 %: a 30 % lower median is within it.
    recorded = _run([27_000], p99_ms=6.0, ratio=1.0)
    now = _run([11_340, 18_900, 26_460], p99_ms=5.0, ratio=1.1)

    assert _moved(now, recorded) == {}


def test_lower_latency_is_better() -> None:
    recorded = _run([27_000], p99_ms=10.0, ratio=1.0)
    now = _run([27_000], p99_ms=5.0, ratio=1.0)

    assert _moved(now, recorded) == {"latency leases p99_ms": "better"}


def test_the_report_says_when_the_runs_are_not_alike() -> None:
    run = _run([27_000], p99_ms=6.0, ratio=1.0)

    lines = report(compare(run, run), same_config=False)

    assert lines[0].startswith("note: the recorded run used other settings")
    assert lines[-1] == "0 of 5 figures moved beyond the noise (0 worse)"
