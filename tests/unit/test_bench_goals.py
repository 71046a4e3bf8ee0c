"""The goals of the router as the single writer, as the router and chat benchmarks print them:
met, or missed by how much, and why where the run measured it."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.chat_bench import Cost, Delivery
from bench.chat_bench import Report as ChatReport
from bench.goals import (
    STORE_SCRIPT,
    Goal,
    chat_goal_lines,
    command_gap,
    goal_lines,
    inside_scripts,
    store_script_lines,
)
from bench.router_bench import Latency, Report, Throughput


def _paced(rate: int, p99_ms: float) -> Latency:
    return Latency(
        router="leases",
        reads="",
        target_rate=rate,
        achieved_rate=float(rate),
        seconds=3.0,
        sent=rate * 3,
        received=rate * 3,
        missing_at_deadline=0,
        wait_after_producer_s=1.0,
        p50_ms=p99_ms / 2,
        p90_ms=p99_ms,
        p99_ms=p99_ms,
        max_ms=p99_ms,
        drained_after_producer_s=0.1,
    )


def _report(ratios: dict[str, float], *, p99_5000: float, latency_rate: int = 5000) -> Report:
    return Report(
        config={},
        environment={},
        baseline={},
        throughput={},
        latency={"leases": _paced(latency_rate, p99_5000)},
        rates={1000: {"leases": _paced(1000, 1.0)}},
        ratios=ratios,
    )


def _verdicts(lines: list[str]) -> list[str]:
    """The end of each goal's line, without the why lines and the reported figure."""
    goals = [line for line in lines if not line.startswith("  ") and "reported" not in line]
    return [line.rsplit(": ", 1)[-1] for line in goals]


AT_THE_BOUNDS = {
    "redis_cpu_leases_over_plain": 0.8,
    "throughput_leases_over_plain": 1.0,
    "worker_cpu_leases_over_plain": 1.0,
    "throughput_batched_over_naive": 15.0,
    "paced_1000_router_cpu_leases_over_plain": 0.8,
    "paced_1000_redis_cpu_leases_over_plain": 0.8,
}
PAST_THE_BOUNDS = {
    "redis_cpu_leases_over_plain": 0.88,
    "throughput_leases_over_plain": 0.9,
    "worker_cpu_leases_over_plain": 1.3,
    "throughput_batched_over_naive": 12.0,
    "paced_1000_router_cpu_leases_over_plain": 1.2,
    "paced_1000_redis_cpu_leases_over_plain": 1.0,
}


def test_a_bound_from_above_is_met_at_or_below_it() -> None:
    goal = Goal("cpu", 0.8, at_most=True)
    assert goal.verdict(0.8).endswith(": met")
    assert goal.verdict(1.0).endswith("missed by 25 %")


def test_a_bound_from_below_is_met_at_or_above_it() -> None:
    goal = Goal("events/s", 1.0, at_most=False)
    assert goal.verdict(1.0).endswith(": met")
    assert goal.verdict(0.8).endswith("missed by 20 %")


def test_a_figure_that_never_arrived_misses_its_goal() -> None:
    goal = Goal("p99", 100.0, at_most=True, unit=" ms")
    assert goal.verdict(float("inf")) == "p99: not every figure arrived (goal <= 100 ms): missed"


def test_every_goal_is_met_at_its_bound() -> None:
    lines = goal_lines(_report(AT_THE_BOUNDS, p99_5000=3.0))

    assert _verdicts(lines) == ["met"] * 8


def test_every_goal_reads_its_own_figure_of_the_run() -> None:
    lines = goal_lines(_report(PAST_THE_BOUNDS, p99_5000=3.6))

    # The store script's lines are this tree's, not the run's: they stay within the bound.
    assert _verdicts(lines) == [
        "missed by 10 %",
        "missed by 10 %",
        "missed by 30 %",
        "missed by 20 %",
        "missed by 50 %",
        "missed by 25 %",
        "missed by 20 %",
        "met",
    ]


def test_a_figure_the_run_did_not_measure_says_so() -> None:
    lines = goal_lines(_report({}, p99_5000=1.0, latency_rate=2000))

    assert [line for line in lines if line.endswith("not measured in this run")] == [
        "drain: streams redis CPU per event / plain batch: not measured in this run",
        "drain: events/s / plain batch: not measured in this run",
        "drain: router CPU per event / plain batch: not measured in this run",
        "drain: events/s / one-at-a-time router: not measured in this run",
        "paced 1,000 ev/s: router CPU per event / plain batch: not measured in this run",
        "paced 1,000 ev/s: streams redis CPU per event / plain batch: not measured in this run",
        "paced 5,000 ev/s: p99: not measured in this run",
    ]


def test_the_store_script_goal_counts_the_lines_of_this_tree(tmp_path: Path) -> None:
    longer = tmp_path / "store_batch.lua"
    longer.write_text("return 0\n" * 151)
    goal = Goal("store script", 150, at_most=True, unit=" lines", digits=0)

    assert goal.verdict(store_script_lines(longer)).endswith(
        "151 lines (goal <= 150 lines): missed by 1 %"
    )
    lines = goal_lines(_report({}, p99_5000=1.0))
    count = len(STORE_SCRIPT.read_text().splitlines())
    assert f"store script (store_batch.lua): {count} lines (goal <= 150 lines)" in "\n".join(lines)


def test_the_memory_per_held_job_is_reported_with_where_to_measure_it() -> None:
    lines = goal_lines(_report({}, p99_5000=1.0))

    assert lines[-1].startswith("router memory per held job: reported, not bounded")
    assert "bench.held_records" in lines[-1]


def test_the_gap_splits_the_script_into_its_commands_and_its_own_work() -> None:
    mine = {"evalsha": 12.0, "rpush": 1.0, "set": 0.6, "xpending": 0.4, "xreadgroup": 1.3}
    plain = {"evalsha": 6.0, "set": 0.7, "xreadgroup": 1.3, "xack": 0.3}

    why = command_gap(mine, plain)

    # EVALSHA's time holds what its scripts call (XPENDING too): 13.3 against 7.6 in all.
    assert why == (
        "server time +5.70 us/event against the plain batch router: "
        "the scripts' own work +4.70, rpush +1.00, xpending +0.40, xack -0.30"
    )


def test_commands_the_router_sends_itself_are_not_taken_for_its_scripts() -> None:
    assert [inside_scripts(c) for c in ("xpending", "mget", "xinfo|stream", "xreadgroup")] == [
        True,
        True,
        True,
        False,
    ]
    assert not inside_scripts("xack")
    assert not inside_scripts("xadd")


def test_a_missed_streams_redis_goal_says_where_the_time_goes() -> None:
    report = _report({"paced_1000_redis_cpu_leases_over_plain": 1.5}, p99_5000=1)
    report.rates[1000]["leases"].redis_usec_per_event_by_command = {"evalsha": 20.0}
    report.rates[1000]["plain_batch"] = _paced(1000, 1.0)
    report.rates[1000]["plain_batch"].redis_usec_per_event_by_command = {"evalsha": 10.0}

    lines = goal_lines(report)

    missed = lines.index(next(line for line in lines if "missed by 88 %" in line))
    assert lines[missed + 1] == (
        "  why: server time +10.00 us/event against the plain batch router: "
        "the scripts' own work +10.00"
    )
    assert sum(line.startswith("  why: ") for line in lines) == 1


def test_a_met_goal_has_no_why() -> None:
    report = _report({"paced_1000_redis_cpu_leases_over_plain": 0.7}, p99_5000=1)
    report.rates[1000]["leases"].redis_usec_per_event_by_command = {"evalsha": 7.0}
    report.rates[1000]["plain_batch"] = _paced(1000, 1.0)
    report.rates[1000]["plain_batch"].redis_usec_per_event_by_command = {"evalsha": 10.0}

    assert not [line for line in goal_lines(report) if line.startswith("  why: ")]


def _drain(worker_us: float, redis_us: float) -> Throughput:
    return Throughput(
        router="r",
        reads="",
        routers=1,
        events=1000,
        jobs=100,
        duplicates_added=0,
        late_added=0,
        fill_s=0.1,
        startup_s=0.1,
        drain_s=1.0,
        events_per_s=1000.0,
        redis_cpu_us_per_event=redis_us,
        pubsub_cpu_us_per_event=1.0,
        worker_cpu_us_per_event=worker_us,
        mean_batch_size=100.0,
        verdicts={},
        shards_held=[4],
        shares=[1.0],
        redis_usec_per_event_by_command={},
    )


@pytest.mark.parametrize(
    "ratios",
    [{"throughput_leases_over_plain": 0.75}, {"worker_cpu_leases_over_plain": 1.43}],
)
def test_a_slower_or_costlier_drain_names_both_processes_cpu_per_event(
    ratios: dict[str, float],
) -> None:
    report = _report(ratios, p99_5000=1)
    report.throughput = {"leases": _drain(20.0, 14.5), "plain_batch": _drain(14.0, 9.2)}

    why = [line for line in goal_lines(report) if line.startswith("  why: ")]

    assert why == [
        "  why: per event, router CPU 20.0 us against the plain batch router's 14.0, streams "
        "redis 14.5 against 9.2"
    ]


@pytest.mark.parametrize("rows_of_5000", ["rates", "latency"])
def test_a_paced_router_cpu_miss_shows_the_cost_at_both_rates(rows_of_5000: str) -> None:
    report = _report({"paced_1000_router_cpu_leases_over_plain": 1.7}, p99_5000=1)
    for rate, mine, plain in ((1000, 207.0, 120.0), (5000, 60.0, 31.0)):
        if rate == 5000 and rows_of_5000 == "latency":
            runs = report.latency
        else:
            runs = report.rates.setdefault(rate, {})
        runs["leases"] = _paced(rate, 1.0)
        runs["leases"].router_cpu_us_per_event = mine
        runs["plain_batch"] = _paced(rate, 1.0)
        runs["plain_batch"].router_cpu_us_per_event = plain

    why = [line for line in goal_lines(report) if line.startswith("  why: ")]

    assert why == [
        "  why: this tree 207 us/event at 1,000 ev/s, 60 at 5,000; plain batch 120 us/event at "
        "1,000 ev/s, 31 at 5,000: the cost is per batch (a read, a store call, a broadcast), "
        "and batches of one or two events carry it alone"
    ]


def test_a_missed_paced_p99_shows_the_plain_batch_routers_beside_it() -> None:
    report = _report({}, p99_5000=4.5)
    report.latency["plain_batch"] = _paced(5000, 2.2)

    lines = goal_lines(report)

    missed = lines.index("paced 5,000 ev/s: p99: 4.50 ms (goal <= 3 ms): missed by 50 %")
    assert lines[missed + 1] == (
        "  why: p50 2.2 ms; the plain batch router's p99 at the same rate 2.2 ms"
    )


# --------------------------------------------------------------------------- chat goals


def _cost(streams_ratio: float) -> Cost:
    cost = Cost(answers=100, tokens_per_answer=200, rounds=3)
    cost.ratio = {"streams_us": streams_ratio}
    cost.command_us = {
        "token": {"evalsha": 8.0, "xreadgroup": 1.0},
        "delta": {"evalsha": 10.0, "xreadgroup": 1.0},
    }
    return cost


def _delivery(*, within_s: float | None, p99_ms: float, delivered: int = 300_000) -> Delivery:
    return Delivery(
        tokens_written=300_000,
        write_rate=30_000.0,
        write_seconds=10.0,
        tokens_expected=300_000,
        tokens_delivered=delivered,
        delivered_within_s=within_s,
        p99_ms=p99_ms,
        unrouted_max=12_000,
        loop_lag_p99_ms=1.5,
        cpu_percent={"router": 61.0, "streams": 45.0},
    )


def _chat(
    cost: list[Cost], delivery: Delivery | None, *, answers: int = 1000, wait_after: float = 10.0
) -> ChatReport:
    args = {"answers": str(answers), "rate": "30", "wait_after": str(wait_after)}
    return ChatReport(args=args, source="this tree", throughput=delivery, cost=cost)


def test_a_token_within_half_a_stage_events_streams_cpu_meets_its_goal() -> None:
    lines = chat_goal_lines(_chat([_cost(0.5)], None))

    assert lines[0] == (
        "tokens (100 answers x 200 tokens): streams redis CPU per token / a stage event's: "
        "0.50x (goal <= 0.5x): met"
    )


def test_a_costlier_token_says_where_the_streams_server_spends_more() -> None:
    lines = chat_goal_lines(_chat([_cost(0.8)], None))

    assert lines[:2] == [
        "tokens (100 answers x 200 tokens): streams redis CPU per token / a stage event's: "
        "0.80x (goal <= 0.5x): missed by 60 %",
        "  why: server time -2.00 us/token against a stage event: the scripts' own work -2.00",
    ]


def test_a_router_that_delivers_every_token_within_the_latency_goal_keeps_up() -> None:
    lines = chat_goal_lines(_chat([], _delivery(within_s=0.08, p99_ms=100.0)))

    assert lines == [
        "tokens (1,000 answers x 30 tokens/s): delivered / written tokens/s: 1.00x (goal >= 1x): "
        "met",
        "  one router delivered 30,000 tokens/s of 30,000",
        "tokens: p99 to a viewer: 100.0 ms (goal <= 100 ms): met",
    ]


def test_a_router_that_falls_behind_misses_by_the_rate_it_delivered() -> None:
    lines = chat_goal_lines(_chat([], _delivery(within_s=10.1, p99_ms=9_800.0)))

    assert lines == [
        "tokens (1,000 answers x 30 tokens/s): delivered / written tokens/s: 0.50x (goal >= 1x): "
        "missed by 50 %",
        "  why: the router at 61 % of a core, the streams redis at 45 %",
        "  one router delivered 15,000 tokens/s of 30,000",
        "tokens: p99 to a viewer: 9800.0 ms (goal <= 100 ms): missed by 9700 %",
        "  why: up to 12,000 chat entries waited for the router while the answers were written; "
        "this bench's loop lag p99 1.5 ms",
    ]


def test_tokens_still_missing_at_the_deadline_count_against_keeping_up() -> None:
    delivery = _delivery(within_s=None, p99_ms=float("inf"), delivered=240_000)

    lines = chat_goal_lines(_chat([], delivery, wait_after=10.0))

    # 80 % of the tokens in the 10 s of writing and the 10 s of waiting.
    assert lines[0].endswith("0.40x (goal >= 1x): missed by 60 %")
    assert lines[3] == "tokens: p99 to a viewer: not every figure arrived (goal <= 100 ms): missed"


def test_a_smaller_load_than_the_goals_says_so() -> None:
    lines = chat_goal_lines(_chat([], _delivery(within_s=0.05, p99_ms=20.0), answers=100))

    assert lines[0].startswith(
        "tokens (100 answers x 30 tokens/s, not the goal's 1,000 x 30): delivered / written"
    )


def test_a_chat_run_without_section_1_says_the_rate_was_not_measured() -> None:
    assert chat_goal_lines(_chat([_cost(0.4)], None))[-1] == (
        "tokens: one router keeping up: not measured in this run"
    )
