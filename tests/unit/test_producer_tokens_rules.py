"""The token rules as values: which statuses a stage event may say, a token's seq and
marker, and when deltas share an entry (`Coalescing`), tested without any publisher."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.parsing import MAX_SEQ
from eco_router.domain.progress import InvalidProgressEvent, StagePlan, Status, progress_event
from eco_router.domain.token_entries import (
    Coalescing,
    PendingText,
    TokensPublished,
    coalescing,
    token_entry,
    token_run,
)

# Numbered like the reference chat worker's 17 stages: intent 10, vision 20, sub-agents
# 30..130, aggregator 140, feedback 150, answer 160, eval 170.
CHAT_PLAN = StagePlan(
    (
        "intent",
        "vision",
        *(f"agent_{n}" for n in range(1, 12)),
        "aggregator",
        "feedback",
        "answer",
        "eval",
    )
)


def merge(rule: Coalescing, deltas: list[tuple[float, str]]) -> list[str]:
    """Every entry `rule` makes of (arrival time, delta) pairs, the last one flushed."""
    entries: list[str] = []
    pending: PendingText | None = None
    for now, delta in deltas:
        pending, closed = rule.add(pending, delta, cost=len(delta), now=now)
        if closed is not None:
            entries.append(closed)
    if pending is not None:
        entries.append(pending.text)
    return entries


class TestTheStageVocabulary:
    def test_the_reference_chat_plan_numbers_answer_done_and_needs_input(self) -> None:
        assert CHAT_PLAN.seq_for("intent", Status.STARTED) == 10
        assert CHAT_PLAN.seq_for("answer", Status.STARTED) == 160
        assert CHAT_PLAN.seq_for("answer", Status.COMPLETED) == 161
        assert CHAT_PLAN.seq_for("done", Status.COMPLETED) == 181
        assert CHAT_PLAN.seq_for("needs_input", Status.WAITING) == 190

    def test_waiting_comes_after_done_in_any_plan(self) -> None:
        for plan in (StagePlan(), StagePlan(("one",)), CHAT_PLAN):
            assert plan.needs_input_seq == (len(plan.stages) + 2) * 10
            assert plan.needs_input_seq > plan.done_seq

    def test_waiting_takes_its_seq_whatever_the_stage_name_as_done_does(self) -> None:
        event = progress_event("job-1", "clarify", "waiting", plan=StagePlan())
        assert (event.status, event.seq) == (Status.WAITING, 60)

    def test_needs_input_outside_the_plan_takes_no_other_status(self) -> None:
        with pytest.raises(InvalidProgressEvent, match="'needs_input' takes status 'waiting'"):
            progress_event("job-1", "needs_input", "started", plan=CHAT_PLAN)

    @pytest.mark.parametrize(
        ("stage", "status", "seq"),
        [("token", "started", None), ("answer", "streaming", None), ("token", "streaming", 1001)],
    )
    def test_a_stage_event_saying_token_or_streaming_points_to_the_token_api(
        self, stage: str, status: str, seq: int | None
    ) -> None:
        with pytest.raises(InvalidProgressEvent, match="publish_tokens") as refused:
            progress_event("job-1", stage, status, plan=CHAT_PLAN, seq=seq)
        assert "\n" not in str(refused.value)

    def test_the_plan_refuses_streaming_even_asked_directly(self) -> None:
        with pytest.raises(InvalidProgressEvent, match="for tokens"):
            CHAT_PLAN.seq_for("answer", Status.STREAMING)


class TestATokensSeqAndMarker:
    def test_a_run_numbers_its_entries_from_its_first_seq(self) -> None:
        run = token_run("job-1", node="answer", attempt=2)
        assert [run.entry(n, "x").seq for n in range(3)] == [1001, 1002, 1003]
        assert run.entry(0, "x").node == "answer"
        assert run.entry(0, "x").attempt == 2

    def test_the_marker_is_per_job_attempt_and_seq(self) -> None:
        entry = token_entry("job-1", "hi", seq=1005, attempt=3)
        assert entry.idempotency_suffix == "5:job-1:token:3:1005"
        same = token_entry("job-1", "something else", seq=1005, attempt=3, node="answer")
        assert same.idempotency_suffix == entry.idempotency_suffix

    def test_colons_in_job_ids_cannot_make_two_tokens_share_a_marker(self) -> None:
        first = token_entry("a:1", "x", seq=2, attempt=0).idempotency_suffix
        second = token_entry("a", "x", seq=2, attempt=1).idempotency_suffix
        assert first != second

    def test_a_run_past_the_largest_seq_is_refused(self) -> None:
        run = token_run("job-1", first_seq=MAX_SEQ)
        assert run.entry(0, "x").seq == MAX_SEQ
        with pytest.raises(InvalidProgressEvent, match="above"):
            run.entry(1, "x")

    @pytest.mark.parametrize(
        ("overrides", "message"),
        [
            ({"job_id": "job 1"}, "job_id"),
            ({"job_id": ""}, "job_id"),
            ({"node": ""}, "node"),
            ({"node": "a:b"}, "node"),
            ({"node": "n" * 65}, "node"),
            ({"node": 3}, "node"),
            ({"attempt": -1}, "attempt"),
            ({"attempt": True}, "attempt"),
            ({"attempt": 1.0}, "attempt"),
            ({"attempt": "1"}, "attempt"),
            ({"first_seq": -1}, "seq"),
            ({"first_seq": MAX_SEQ + 1}, "seq"),
            ({"first_seq": True}, "seq"),
        ],
    )
    def test_bad_settings_are_refused_naming_what_is_wrong(
        self, overrides: dict[str, Any], message: str
    ) -> None:
        values: dict[str, Any] = {"job_id": "job-1", "node": None, "attempt": 0}
        values |= {"first_seq": FIRST_TOKEN_SEQ} | overrides
        with pytest.raises(InvalidProgressEvent, match=message):
            token_run(values.pop("job_id"), **values)

    def test_content_must_be_text(self) -> None:
        with pytest.raises(InvalidProgressEvent, match="content must be a str"):
            token_entry("job-1", b"bytes", seq=1001)  # type: ignore[arg-type]

    def test_the_next_run_starts_after_the_last_seq(self) -> None:
        assert TokensPublished(3, 1001, 1003, 9, 9).next_seq == 1004
        assert TokensPublished(0, 1001, None, 0, 0).next_seq == 1001


class TestCoalescing:
    def test_deltas_within_the_window_share_an_entry(self) -> None:
        rule = Coalescing(window_s=0.05, max_cost=1000)
        assert merge(rule, [(0.0, "a"), (0.01, "b"), (0.049, "c")]) == ["abc"]

    def test_the_window_counts_from_the_entrys_first_delta_not_the_last(self) -> None:
        rule = Coalescing(window_s=0.05, max_cost=1000)
        deltas = [(0.0, "a"), (0.03, "b"), (0.06, "c"), (0.09, "d"), (0.12, "e")]
        assert merge(rule, deltas) == ["ab", "cd", "e"]

    def test_a_delta_at_the_windows_end_starts_the_next_entry(self) -> None:
        rule = Coalescing(window_s=0.05, max_cost=1000)
        assert merge(rule, [(0.0, "a"), (0.05, "b")]) == ["a", "b"]

    def test_a_zero_window_gives_each_delta_its_own_entry_even_at_one_instant(self) -> None:
        rule = Coalescing(window_s=0.0, max_cost=1000)
        assert merge(rule, [(1.0, "a"), (1.0, "b"), (1.0, "c")]) == ["a", "b", "c"]

    def test_an_entry_closes_before_it_would_exceed_its_budget(self) -> None:
        rule = Coalescing(window_s=10.0, max_cost=5)
        assert merge(rule, [(0.0, "abc"), (0.0, "de"), (0.0, "f")]) == ["abcde", "f"]

    def test_a_delta_larger_than_the_budget_is_kept_whole_in_an_entry_of_its_own(self) -> None:
        rule = Coalescing(window_s=10.0, max_cost=3)
        assert merge(rule, [(0.0, "a"), (0.0, "bcdef"), (0.0, "g")]) == ["a", "bcdef", "g"]

    def test_the_pending_entry_is_due_at_the_end_of_its_window(self) -> None:
        rule = Coalescing(window_s=0.05, max_cost=10)
        pending, _ = rule.add(None, "a", cost=1, now=2.0)
        pending, _ = rule.add(pending, "b", cost=1, now=2.04)
        assert rule.due_at(pending) == pytest.approx(2.05)

    @pytest.mark.parametrize("coalesce_ms", [-1, float("nan"), float("inf"), True, "50"])
    def test_a_window_that_is_not_a_finite_number_of_at_least_0_is_refused(
        self, coalesce_ms: Any
    ) -> None:
        with pytest.raises(InvalidProgressEvent, match="coalesce_ms"):
            coalescing(coalesce_ms, max_cost=100)

    def test_the_window_is_given_in_milliseconds(self) -> None:
        assert coalescing(50, max_cost=100).window_s == pytest.approx(0.05)

    @given(
        deltas=st.lists(st.tuples(st.floats(0, 0.2), st.text(min_size=1, max_size=8)), max_size=40),
        window_ms=st.integers(0, 100),
        max_cost=st.integers(1, 20),
    )
    def test_entries_are_whole_deltas_in_order_within_budget_and_window(
        self, deltas: list[tuple[float, str]], window_ms: int, max_cost: int
    ) -> None:
        arrivals: list[tuple[float, str]] = []
        now = 0.0
        for gap, delta in deltas:
            now += gap
            arrivals.append((now, delta))
        rule = Coalescing(window_ms / 1000, max_cost)

        entries = merge(rule, arrivals)

        assert "".join(entries) == "".join(delta for _, delta in arrivals)
        # Each entry is a run of whole deltas: cut the deltas at the entries' boundaries.
        remaining = [delta for _, delta in arrivals]
        for entry in entries:
            taken: list[tuple[float, str]] = []
            while "".join(d for _, d in taken) != entry:
                taken.append(arrivals[len(arrivals) - len(remaining)])
                remaining.pop(0)
            assert len(taken) == 1 or sum(len(d) for _, d in taken) <= max_cost
            assert taken[-1][0] - taken[0][0] < rule.window_s or len(taken) == 1
