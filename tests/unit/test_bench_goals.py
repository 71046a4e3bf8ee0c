"""The read path's goals as the router benchmark prints them: met, or missed by how much."""

from __future__ import annotations

from bench.goals import Goal, command_gap, goal_lines, inside_scripts
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


def _report(ratios: dict[str, float], *, p99_1000: float, p99_5000: float) -> Report:
    return Report(
        config={},
        environment={},
        baseline={},
        throughput={},
        latency={"leases": _paced(5000, p99_5000)},
        rates={1000: {"leases": _paced(1000, p99_1000)}},
        ratios=ratios,
    )


def test_a_bound_from_above_is_met_at_or_below_it() -> None:
    goal = Goal("cpu", 1.2, at_most=True)
    assert goal.verdict(1.2).endswith(": met")
    assert goal.verdict(1.5).endswith("missed by 25 %")


def test_a_bound_from_below_is_met_at_or_above_it() -> None:
    goal = Goal("events/s", 1.0, at_most=False)
    assert goal.verdict(1.0).endswith(": met")
    assert goal.verdict(0.8).endswith("missed by 20 %")


def test_every_goal_reads_its_own_figure_of_the_run() -> None:
    lines = goal_lines(
        _report(
            {
                "redis_cpu_leases_over_plain": 1.1,
                "throughput_leases_over_plain": 0.9,
                "throughput_batched_over_naive": 16.0,
                "paced_1000_router_cpu_leases_over_plain": 1.3,
                "paced_1000_redis_cpu_leases_over_plain": 1.0,
            },
            p99_1000=2.5,
            p99_5000=2.9,
        )
    )
    assert [line.rsplit(": ", 1)[-1] for line in lines] == [
        "met",
        "missed by 10 %",
        "met",
        "missed by 30 %",
        "met",
        "missed by 25 %",
        "met",
    ]


def test_a_figure_the_run_did_not_measure_says_so() -> None:
    lines = goal_lines(_report({}, p99_1000=1.0, p99_5000=1.0))
    assert lines[0].endswith("not measured in this run")


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
    report = _report({"paced_1000_redis_cpu_leases_over_plain": 1.5}, p99_1000=1, p99_5000=1)
    report.rates[1000]["leases"].redis_usec_per_event_by_command = {"evalsha": 20.0}
    report.rates[1000]["plain_batch"] = _paced(1000, 1.0)
    report.rates[1000]["plain_batch"].redis_usec_per_event_by_command = {"evalsha": 10.0}

    lines = goal_lines(report)

    missed = lines.index(next(line for line in lines if "missed by 36 %" in line))
    assert lines[missed + 1] == (
        "  why: server time +10.00 us/event against the plain batch router: "
        "the scripts' own work +10.00"
    )
    assert sum(line.startswith("  why: ") for line in lines) == 1


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


def test_a_slower_drain_names_both_processes_cpu_per_event() -> None:
    report = _report({"throughput_leases_over_plain": 0.75}, p99_1000=1, p99_5000=1)
    report.throughput = {"leases": _drain(20.0, 14.5), "plain_batch": _drain(14.0, 9.2)}

    lines = goal_lines(report)

    assert (
        "  why: per event, router CPU 20.0 us against the plain batch router's 14.0, streams "
        "redis 14.5 against 9.2"
    ) in lines


def test_a_paced_router_cpu_miss_shows_the_cost_at_both_rates() -> None:
    report = _report({"paced_1000_router_cpu_leases_over_plain": 1.7}, p99_1000=1, p99_5000=1)
    for rate, mine, plain in ((1000, 207.0, 120.0), (5000, 60.0, 31.0)):
        report.rates.setdefault(rate, {})
        report.rates[rate]["leases"] = _paced(rate, 1.0)
        report.rates[rate]["leases"].router_cpu_us_per_event = mine
        report.rates[rate]["plain_batch"] = _paced(rate, 1.0)
        report.rates[rate]["plain_batch"].router_cpu_us_per_event = plain

    why = [line for line in goal_lines(report) if line.startswith("  why: ")]

    assert why == [
        "  why: this tree 207 us/event at 1,000 ev/s, 60 at 5,000; plain batch 120 us/event at "
        "1,000 ev/s, 31 at 5,000: the cost is per batch (a read, an apply, a broadcast), and "
        "batches of one or two events carry it alone"
    ]
