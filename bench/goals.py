"""The goals of the router as the single writer of its shards' jobs (Redis only stores), each
as met or missed by how much: those of the router benchmark (`goal_lines`) and those of the
chat benchmark (`chat_goal_lines`), from one run of each."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bench.plain_batch import APPLY_BATCH_LUA

if TYPE_CHECKING:
    from bench.chat_bench import Delivery
    from bench.chat_bench import Report as ChatReport
    from bench.router_bench import Latency, Report

REDIS_ADAPTERS = Path(__file__).resolve().parent.parent / "src/eco_router/adapters/redis"
# The script that carries a batch's writes, the router's one fenced call per batch.
STORE_SCRIPT = REDIS_ADAPTERS / "lua" / "store_batch.lua"


def _script_commands() -> frozenset[str]:
    """The commands the router's scripts and the plain batch router's may call, lower case as
    commandstats names them: each quoted upper-case word of their source."""
    names = {
        name
        for module in (REDIS_ADAPTERS / "router").glob("*.py")
        for name in re.findall(r'load_lua\("([a-z_]+\.lua)"\)', module.read_text())
    }
    scripts = [(REDIS_ADAPTERS / "lua" / name).read_text() for name in sorted(names)]
    sources = [APPLY_BATCH_LUA, *scripts]
    words = {word.lower() for source in sources for word in re.findall(r"'([A-Z]+)'", source)}
    # The benchmark's producer sends XADD itself; the dead-letter script's are rare.
    return frozenset(words - {"xadd"})


# Commandstats counts a command a script calls twice: on its own line and inside EVALSHA's
# time. A command also sent outside scripts is taken as the scripts' (XRANGE when a group is
# re-created) or not (XADD): commandstats cannot tell the two apart, and the other calls are
# rare.
SCRIPT_COMMANDS = _script_commands()


def inside_scripts(command: str) -> bool:
    """Whether commandstats' `command` ("xinfo|stream" included) is one the scripts call."""
    return command.partition("|")[0] in SCRIPT_COMMANDS


# How many commands a "why" line names, largest difference first.
NAMED = 4


@dataclass(frozen=True, slots=True)
class Goal:
    """One goal: what is measured, the bound, and which side of it is good."""

    name: str
    bound: float
    at_most: bool
    unit: str = "x"
    digits: int = 2

    def met(self, measured: float) -> bool:
        return measured <= self.bound if self.at_most else measured >= self.bound

    def verdict(self, measured: float | None) -> str:
        if measured is None:
            return f"{self.name}: not measured in this run"
        sign = "<=" if self.at_most else ">="
        bound = f"(goal {sign} {self.bound:g}{self.unit})"
        if math.isinf(measured):
            return f"{self.name}: not every figure arrived {bound}: missed"
        shown = f"{measured:.{self.digits}f}{self.unit} {bound}"
        if self.met(measured):
            return f"{self.name}: {shown}: met"
        return f"{self.name}: {shown}: missed by {abs(measured / self.bound - 1) * 100:.0f} %"


def judged(
    goal: Goal, measured: float | None, explain: Callable[[], str | None] | None = None
) -> list[str]:
    """The goal's line and, under a miss, what explains it where the run measured that."""
    lines = [goal.verdict(measured)]
    if explain is not None and measured is not None and not goal.met(measured):
        why = explain()
        if why is not None:
            lines.append(f"  why: {why}")
    return lines


# --------------------------------------------------------------------------- router benchmark


def _ratio(key: str) -> Callable[[Report], float | None]:
    return lambda report: report.ratios.get(key)


def _paced(report: Report, rate: int, column: str) -> Latency | None:
    """Column `column`'s paced run at `rate`: section 5's, else the latency rows' at that rate."""
    paced: Latency | None = report.rates.get(rate, {}).get(column)
    if paced is None:
        paced = report.latency.get(column)
    if paced is None or paced.target_rate != rate:
        return None
    return paced


def _paced_p99(rate: int) -> Callable[[Report], float | None]:
    def p99(report: Report) -> float | None:
        paced = _paced(report, rate, "leases")
        return None if paced is None else paced.p99_ms

    return p99


def _p99_beside_plain(rate: int) -> Callable[[Report], str | None]:
    """Why a paced p99 is missed: the plain batch router's at the same rate, which tells the
    machine's share from the router's."""

    def why(report: Report) -> str | None:
        mine, plain = _paced(report, rate, "leases"), _paced(report, rate, "plain_batch")
        if mine is None or plain is None or mine.p50_ms is None or plain.p99_ms is None:
            return None
        return (
            f"p50 {mine.p50_ms:.1f} ms; the plain batch router's p99 at the same rate "
            f"{plain.p99_ms:.1f} ms"
        )

    return why


def _usec_by_command(report: Report, column: str, rate: int | None) -> Mapping[str, float]:
    if rate is None:
        drain = report.throughput.get(column)
        return drain.redis_usec_per_event_by_command if drain else {}
    paced = report.rates.get(rate, {}).get(column)
    return paced.redis_usec_per_event_by_command if paced else {}


def command_gap(
    mine: Mapping[str, float],
    plain: Mapping[str, float],
    *,
    against: str = "the plain batch router",
    per: str = "event",
) -> str | None:
    """Where the streams server spends more per event than `against` (the plain batch
    router's): the largest differences by command, EVALSHA's split into its inner commands
    and the script's own work (the Lua interpreter, the arguments). None without both
    breakdowns."""
    if not mine or not plain:
        return None
    inner = {c for c in {*mine, *plain} if inside_scripts(c)}

    def own_work(usec: Mapping[str, float]) -> float:
        return usec.get("evalsha", 0.0) - sum(usec.get(c, 0.0) for c in inner)

    gaps = {c: mine.get(c, 0.0) - plain.get(c, 0.0) for c in {*mine, *plain} if c != "evalsha"}
    gaps["the scripts' own work"] = own_work(mine) - own_work(plain)
    total = sum(mine.values()) - sum(mine.get(c, 0.0) for c in inner)
    total -= sum(plain.values()) - sum(plain.get(c, 0.0) for c in inner)
    shown = [(c, gap) for c, gap in gaps.items() if round(gap, 2)]
    largest = sorted(shown, key=lambda item: (-abs(item[1]), item[0]))[:NAMED]
    named = ", ".join(f"{c} {gap:+.2f}" for c, gap in largest)
    return f"server time {total:+.2f} us/{per} against {against}: {named}"


def _redis_gap(rate: int | None) -> Callable[[Report], str | None]:
    """Why a streams-Redis goal of the drain (None) or of the paced run at `rate` is missed."""
    return lambda report: command_gap(
        _usec_by_command(report, "leases", rate), _usec_by_command(report, "plain_batch", rate)
    )


def _drain_bound(report: Report) -> str | None:
    """Why a drain is slower or costs the router more: what each process spends per event,
    against the plain router's (one router drains as fast as the busier of its process and
    its server lets it)."""
    mine, plain = report.throughput.get("leases"), report.throughput.get("plain_batch")
    if mine is None or plain is None:
        return None
    return (
        f"per event, router CPU {mine.worker_cpu_us_per_event:.1f} us against the plain batch "
        f"router's {plain.worker_cpu_us_per_event:.1f}, streams redis "
        f"{mine.redis_cpu_us_per_event:.1f} against {plain.redis_cpu_us_per_event:.1f}"
    )


def _per_batch(report: Report) -> str | None:
    """Why the router's CPU per event is high at 1,000 events/s: what each column spends per
    event there and at 5,000 events/s (section 5's or the latency rows'), where batches are
    larger."""
    cells = []
    for key, name in (("leases", "this tree"), ("plain_batch", "plain batch")):
        slow, fast = _paced(report, 1000, key), _paced(report, 5000, key)
        if slow is None or fast is None:
            return None
        cells.append(
            f"{name} {slow.router_cpu_us_per_event:.0f} us/event at 1,000 ev/s, "
            f"{fast.router_cpu_us_per_event:.0f} at 5,000"
        )
    return (
        "; ".join(cells) + ": the cost is per batch (a read, a store call, a broadcast), and "
        "batches of one or two events carry it alone"
    )


def store_script_lines(script: Path = STORE_SCRIPT) -> float:
    """The lines of the script that carries a batch's writes to Redis."""
    return float(len(script.read_text().splitlines()))


@dataclass(frozen=True, slots=True)
class GoalCheck:
    """A goal, the figure of a run it is held to and, if known, what explains a miss."""

    goal: Goal
    measure: Callable[[Report], float | None]
    explain: Callable[[Report], str | None] | None = None


GOALS: Sequence[GoalCheck] = (
    GoalCheck(
        Goal("drain: streams redis CPU per event / plain batch", 0.8, at_most=True),
        _ratio("redis_cpu_leases_over_plain"),
        _redis_gap(None),
    ),
    GoalCheck(
        Goal("drain: events/s / plain batch", 1.0, at_most=False),
        _ratio("throughput_leases_over_plain"),
        _drain_bound,
    ),
    GoalCheck(
        Goal("drain: router CPU per event / plain batch", 1.0, at_most=True),
        _ratio("worker_cpu_leases_over_plain"),
        _drain_bound,
    ),
    GoalCheck(
        Goal("drain: events/s / one-at-a-time router", 15.0, at_most=False),
        _ratio("throughput_batched_over_naive"),
    ),
    GoalCheck(
        Goal("paced 1,000 ev/s: router CPU per event / plain batch", 0.8, at_most=True),
        _ratio("paced_1000_router_cpu_leases_over_plain"),
        _per_batch,
    ),
    GoalCheck(
        Goal("paced 1,000 ev/s: streams redis CPU per event / plain batch", 0.8, at_most=True),
        _ratio("paced_1000_redis_cpu_leases_over_plain"),
        _redis_gap(1000),
    ),
    GoalCheck(
        Goal("paced 5,000 ev/s: p99", 3.0, at_most=True, unit=" ms"),
        _paced_p99(5000),
        _p99_beside_plain(5000),
    ),
    GoalCheck(
        Goal(f"store script ({STORE_SCRIPT.name})", 150, at_most=True, unit=" lines", digits=0),
        lambda report: store_script_lines(),
    ),
)

# Reported, not bounded; its own run takes about a minute, too long to add to every bench.
HELD_RECORD_MEMORY = (
    "router memory per held job: reported, not bounded: "
    "`.venv/bin/python -m bench.held_records` measures it (about a minute)"
)


def goal_lines(report: Report) -> list[str]:
    """One line per goal: the figure of this run, and met or missed by how much; under a
    missed one, what explains it where the run measured that."""
    lines = []
    for check in GOALS:
        explain = None if check.explain is None else partial(check.explain, report)
        lines += judged(check.goal, check.measure(report), explain)
    lines.append(HELD_RECORD_MEMORY)
    return lines


# --------------------------------------------------------------------------- chat benchmark

# The load one router must keep up with, and the latency a viewer may see.
KEEP_UP_ANSWERS = 1_000
KEEP_UP_RATE = 30
TOKEN_P99 = Goal("tokens: p99 to a viewer", 100.0, at_most=True, unit=" ms", digits=1)
TOKEN_COST = Goal("streams redis CPU per token / a stage event's", 0.5, at_most=True)


def kept_up(d: Delivery, wait_after_s: float) -> float | None:
    """The share of the written rate one router delivered: tokens delivered over those the
    viewers expected, times the writing time over the time until the last one arrived, less
    the latency goal (a router that keeps up delivers the last token within it). 1.0 when it
    kept up."""
    if not d.tokens_expected or not d.write_seconds:
        return None
    within = wait_after_s if d.delivered_within_s is None else d.delivered_within_s
    late = max(0.0, within - TOKEN_P99.bound / 1000)
    delivered = min(1.0, (d.tokens_delivered + d.tokens_recovered) / d.tokens_expected)
    return delivered * d.write_seconds / (d.write_seconds + late)


def _cpu_shares(d: Delivery) -> str | None:
    cpu = d.cpu_percent
    return (
        f"the router at {cpu.get('router', 0):.0f} % of a core, the streams redis at "
        f"{cpu.get('streams', 0):.0f} %"
    )


def chat_goal_lines(report: ChatReport) -> list[str]:
    """The token goals, from section 2 (cost per token against a stage event, per backlog
    shape) and section 1 (one router under `--answers` x `--rate`), as `goal_lines` does."""
    lines: list[str] = []
    for c in report.cost:
        shape = f"{c.answers:,} answers x {c.tokens_per_answer:,} tokens"
        lines += judged(
            replace(TOKEN_COST, name=f"tokens ({shape}): {TOKEN_COST.name}"),
            c.ratio.get("streams_us"),
            partial(
                command_gap,
                c.command_us.get("token", {}),
                c.command_us.get("delta", {}),
                against="a stage event",
                per="token",
            ),
        )
    d = report.throughput
    if d is None:
        lines.append("tokens: one router keeping up: not measured in this run")
        return lines
    answers, rate = int(report.args["answers"]), int(report.args["rate"])
    load = f"{answers:,} answers x {rate} tokens/s"
    if (answers, rate) != (KEEP_UP_ANSWERS, KEEP_UP_RATE):
        load += f", not the goal's {KEEP_UP_ANSWERS:,} x {KEEP_UP_RATE}"
    share = kept_up(d, float(report.args["wait_after"]))
    goal = Goal(f"tokens ({load}): delivered / written tokens/s", 1.0, at_most=False)
    delivered = None if share is None else share * d.write_rate
    lines += judged(goal, share, partial(_cpu_shares, d))
    if delivered is not None:
        lines.append(f"  one router delivered {delivered:,.0f} tokens/s of {d.write_rate:,.0f}")
    lines += judged(
        TOKEN_P99,
        d.p99_ms,
        lambda: (
            f"up to {d.unrouted_max or 0:,} chat entries waited for the router while the "
            f"answers were written; this bench's loop lag p99 {d.loop_lag_p99_ms or 0:.1f} ms"
        ),
    )
    return lines
