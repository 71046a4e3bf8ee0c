"""The control rules: a control request's validation, lifecycle events judged apart from
stages and tokens, their ids, and when a job has ended."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eco_router.domain.control import (
    MAX_CONTROL_BODY_BYTES,
    ControlKind,
    InvalidControl,
    control_request,
    has_ended,
    lifecycle_event_id,
    lifecycle_fields,
)
from eco_router.domain.event import LIFECYCLE_STAGES, JobEvent
from eco_router.domain.text import TextRecord
from eco_router.domain.verdict import (
    DUPLICATE,
    NEW_APPLY,
    NEW_IN_PLACE_OF_GONE,
    NEW_REPUBLISH,
    STALE,
    JobRecord,
    in_judging_order,
    judge,
    judge_stage,
)
from tests.unit.factories import make_event

E1, E2 = "1700000000000-1", "1700000000000-2"


def lifecycle(seq: int = 1, stage: str = "cancel_requested", stream_id: str = E1) -> JobEvent:
    return make_event(seq=seq, stage=stage, status="requested", stream_id=stream_id)


class TestJudgeLifecycle:
    @pytest.mark.parametrize("stage", sorted(LIFECYCLE_STAGES))
    @pytest.mark.parametrize(
        ("record", "stream_id", "expected"),
        [
            pytest.param(JobRecord(), E1, NEW_APPLY, id="unknown job: NEW"),
            pytest.param(JobRecord(180, {180: E2}), E1, NEW_APPLY, id="after later stages: NEW"),
            pytest.param(JobRecord(None, None, frozenset(), TextRecord(0, 1300)), E1, NEW_APPLY,
                         id="after tokens: NEW"),
            pytest.param("same", E1, NEW_REPUBLISH, id="its own entry again: republish"),
            pytest.param("same", E2, DUPLICATE, id="another entry, same marker: DUPLICATE"),
            pytest.param("gone", E2, NEW_IN_PLACE_OF_GONE, id="the marking entry gone: takes over"),
        ],
    )  # fmt: skip
    def test_verdict_table(
        self, stage: str, record: JobRecord | str, stream_id: str, expected: object
    ) -> None:
        event = lifecycle(1, stage, stream_id)
        if record == "same":
            record = JobRecord(5, {5: E2}, lifecycle_by={event.lifecycle_marker: E1})
        elif record == "gone":
            record = JobRecord(5, None, frozenset({E1}), lifecycle_by={event.lifecycle_marker: E1})
        assert isinstance(record, JobRecord)

        assert judge(event, record) == expected

    def test_a_stage_marker_of_the_same_seq_does_not_count(self) -> None:
        record = JobRecord(1, {1: E2})

        assert judge(lifecycle(1), record) == NEW_APPLY

    def test_a_lifecycle_marker_does_not_make_a_stage_stale(self) -> None:
        record = JobRecord(10, {10: E2}, lifecycle_by={"needs_input:190": E1})

        assert judge_stage(make_event(seq=11, stream_id="1700000000001-0"), record) == NEW_APPLY

    def test_a_stage_at_or_below_the_last_stays_stale(self) -> None:
        record = JobRecord(10, {10: E2}, lifecycle_by={"cancel_requested:11": E1})

        assert judge(make_event(seq=9, stream_id="1700000000001-0"), record) == STALE

    def test_markers_name_the_stage_and_the_seq(self) -> None:
        assert lifecycle(3, "input_received").lifecycle_marker == "input_received:3"
        assert lifecycle(3).is_lifecycle
        assert not make_event(seq=3).is_lifecycle


class TestJudgingOrder:
    def test_a_run_of_lifecycle_events_keeps_its_stream_order(self) -> None:
        events = [lifecycle(2, stream_id="1-2"), lifecycle(1, stream_id="1-3")]

        assert in_judging_order(events) == events

    def test_nothing_moves_across_a_lifecycle_event(self) -> None:
        stage_20 = make_event(seq=20, stream_id="1-1")
        cancel = lifecycle(1, stream_id="1-2")
        stage_10 = make_event(seq=10, stream_id="1-3")

        assert in_judging_order([stage_20, cancel, stage_10]) == [stage_20, cancel, stage_10]

    @given(st.lists(st.sampled_from(["s", "t", "l"]), max_size=12))
    def test_each_kind_keeps_its_runs_in_place(self, kinds: list[str]) -> None:
        events = []
        for n, kind in enumerate(kinds):
            stage = {"s": "vision", "t": "token", "l": "input_received"}[kind]
            events.append(make_event(seq=100 - n, stage=stage, stream_id=f"1-{n}"))
        ordered = in_judging_order(events)

        assert [e.stage for e in ordered] == [e.stage for e in events]


class TestEventIds:
    @pytest.mark.parametrize(("last", "expected"), [(None, 0), (0, 1), (41, 42)])
    def test_a_lifecycle_event_takes_the_next_id(self, last: int | None, expected: int) -> None:
        assert lifecycle_event_id(last) == expected


class TestHasEnded:
    @pytest.mark.parametrize(
        ("state", "ended"),
        [
            (None, False),
            ({"stage": "vision", "status": "started"}, False),
            ({"stage": "needs_input", "status": "waiting"}, False),
            ({"stage": "done", "status": "cancelled"}, True),
            ({"stage": "done", "status": "done"}, True),
            ({"stage": "x", "status": "done"}, True),
            ({"stage": "vision", "status": "failed"}, True),
        ],
    )
    def test_a_job_ends_as_the_gateway_ends_its_stream(
        self, state: dict[str, str] | None, ended: bool
    ) -> None:
        assert has_ended(state) is ended


class TestControlRequest:
    def test_a_cancel_without_a_body_takes_the_idempotency_key(self) -> None:
        request = control_request("chat", "J", ControlKind.CANCEL, b"", "k-1")

        assert (request.request_id, request.body) == ("k-1", b"{}")

    def test_the_request_id_may_come_in_the_body_and_is_not_kept_in_it(self) -> None:
        raw = b'{"request_id": "r1", "input": "oui"}'
        request = control_request("chat", "J", ControlKind.INPUT, raw, None)

        assert (request.request_id, json.loads(request.body)) == ("r1", {"input": "oui"})

    def test_the_same_key_in_both_places_is_accepted(self) -> None:
        raw = b'{"request_id": "r1", "input": 1}'

        assert control_request("chat", "J", ControlKind.INPUT, raw, "r1").request_id == "r1"

    def test_a_body_at_the_limit_is_accepted(self) -> None:
        raw = b'{"input":"' + b"x" * (MAX_CONTROL_BODY_BYTES - 12) + b'"}'
        assert len(raw) == MAX_CONTROL_BODY_BYTES

        assert control_request("chat", "J", ControlKind.INPUT, raw, "k").body == raw

    @pytest.mark.parametrize(
        ("kind", "raw", "key", "message"),
        [
            (ControlKind.INPUT, b'{"input":"' + b"x" * MAX_CONTROL_BODY_BYTES + b'"}', "k",
             "the body has 4108 bytes (max 4096)"),
            (ControlKind.INPUT, b"{nope", "k", "the body is not JSON: "),
            (ControlKind.INPUT, b"NaN", "k", "the body holds NaN, which JSON cannot carry"),
            (ControlKind.INPUT, b"[1]", "k", "the body must be a JSON object"),
            (ControlKind.INPUT, b'"yes"', "k", "the body must be a JSON object"),
            (ControlKind.INPUT, b"{}", "k", "an input needs at least one member"),
            (ControlKind.INPUT, b'{"request_id":"k"}', None, "an input needs at least one member"),
            (ControlKind.CANCEL, b"{}", None, "an Idempotency-Key header or a request_id field"),
            (ControlKind.CANCEL, b'{"request_id": 5}', None, "request_id must be a string"),
            (ControlKind.CANCEL, b'{"request_id": "a"}', "b", "the Idempotency-Key header and"),
            (ControlKind.CANCEL, b"", "", "the request id must be 1-128 characters"),
            (ControlKind.CANCEL, b"", "a b", "the request id must be 1-128 characters"),
            (ControlKind.CANCEL, b"", "x" * 129, "the request id must be 1-128 characters"),
        ],
    )  # fmt: skip
    def test_what_is_wrong_is_said_in_one_line(
        self, kind: ControlKind, raw: bytes, key: str | None, message: str
    ) -> None:
        with pytest.raises(InvalidControl) as caught:
            control_request("chat", "J", kind, raw, key)

        assert str(caught.value).startswith(message)
        assert "\n" not in str(caught.value)

    @pytest.mark.parametrize("kind", list(ControlKind))
    def test_the_announcement_is_a_lifecycle_event_numbered_by_the_message(
        self, kind: ControlKind
    ) -> None:
        request = control_request("chat", "J", kind, b'{"input":"y"}', "k")
        fields = lifecycle_fields(request, "5-0", 3, "2026-01-01T00:00:00Z")

        assert fields["stage"] == kind.stage
        assert fields["stage"] in LIFECYCLE_STAGES
        assert (fields["seq"], fields["control_id"], fields["request_id"]) == ("3", "5-0", "k")
        assert json.loads(fields["result"]) == {"input": "y"}
