"""Parsing raw stream entries into events, and every reason an entry is rejected."""

from __future__ import annotations

import pytest

from eco_router.domain.event import JobEvent
from eco_router.domain.parsing import MAX_SEQ, parse_entry
from eco_router.domain.rejection import Rejection, RejectReason
from tests.unit.factories import make_fields

STREAM = "scan:events:2"
ENTRY_ID = "1700000000123-4"


def parse(fields: dict[bytes, bytes], *, max_field_bytes: int = 64 * 1024) -> JobEvent | Rejection:
    return parse_entry(
        domain="scan",
        stream=STREAM,
        entry_id=ENTRY_ID,
        fields=fields,
        max_field_bytes=max_field_bytes,
    )


def parsed_event(fields: dict[bytes, bytes]) -> JobEvent:
    outcome = parse(fields)
    assert isinstance(outcome, JobEvent), outcome
    return outcome


class TestRejections:
    @pytest.mark.parametrize(
        ("fields", "reason"),
        [
            pytest.param(make_fields(job_id=None), RejectReason.MISSING_JOB_ID, id="no job_id"),
            pytest.param(make_fields(job_id=""), RejectReason.MISSING_JOB_ID, id="empty job_id"),
            pytest.param(make_fields(job_id="job 1"), RejectReason.INVALID_JOB_ID, id="space"),
            pytest.param(make_fields(job_id="job/1"), RejectReason.INVALID_JOB_ID, id="slash"),
            pytest.param(make_fields(job_id="jöb"), RejectReason.INVALID_JOB_ID, id="non-ascii"),
            pytest.param(make_fields(job_id="job\n"), RejectReason.INVALID_JOB_ID, id="newline"),
            pytest.param(make_fields(job_id="j" * 129), RejectReason.INVALID_JOB_ID, id="129"),
            pytest.param(make_fields(seq=None), RejectReason.MISSING_SEQ, id="no seq"),
            pytest.param(make_fields(seq=""), RejectReason.MISSING_SEQ, id="empty seq"),
            pytest.param(make_fields(seq="abc"), RejectReason.SEQ_NOT_INTEGER, id="seq abc"),
            pytest.param(make_fields(seq="1.5"), RejectReason.SEQ_NOT_INTEGER, id="seq 1.5"),
            pytest.param(make_fields(seq="1e3"), RejectReason.SEQ_NOT_INTEGER, id="seq 1e3"),
            pytest.param(make_fields(seq=" 1"), RejectReason.SEQ_NOT_INTEGER, id="seq padded"),
            pytest.param(make_fields(seq="٣"), RejectReason.SEQ_NOT_INTEGER, id="seq non-ascii"),
            pytest.param(make_fields(seq=2**53), RejectReason.SEQ_NOT_INTEGER, id="seq 2**53"),
            pytest.param(
                make_fields(seq="9" * 5000), RejectReason.SEQ_NOT_INTEGER, id="seq 5000 digits"
            ),
            pytest.param(make_fields(seq="-1"), RejectReason.SEQ_NEGATIVE, id="seq -1"),
            pytest.param(
                make_fields(progress="x"), RejectReason.PROGRESS_NOT_INTEGER, id="progress x"
            ),
            pytest.param(
                make_fields(progress="12.5"), RejectReason.PROGRESS_NOT_INTEGER, id="progress 12.5"
            ),
            pytest.param(
                make_fields(progress=2**64),
                RejectReason.PROGRESS_NOT_INTEGER,
                id="progress beyond 64 bits",
            ),
            pytest.param(
                make_fields(progress="1" * 5000),
                RejectReason.PROGRESS_NOT_INTEGER,
                id="progress 5000 digits",
            ),
            pytest.param(make_fields(stage=b"sc\xffan"), RejectReason.NOT_UTF8, id="value bytes"),
            pytest.param(
                {**make_fields(), b"na\xc3me": b"x"}, RejectReason.NOT_UTF8, id="name bytes"
            ),
            pytest.param(
                make_fields(result="not json"), RejectReason.RESULT_NOT_JSON, id="result text"
            ),
            pytest.param(
                make_fields(result='{"a": 1'), RejectReason.RESULT_NOT_JSON, id="result cut"
            ),
            pytest.param(
                make_fields(result="[" * 20_000 + "]" * 20_000),
                RejectReason.RESULT_NOT_JSON,
                id="result nested too deep",
            ),
            pytest.param(
                make_fields(note=b"x" * 1_000_000), RejectReason.FIELD_TOO_LARGE, id="1 MB field"
            ),
            pytest.param(
                make_fields(result="NaN"), RejectReason.RESULT_NOT_FINITE, id="result NaN"
            ),
            pytest.param(
                make_fields(result='{"score": [1, Infinity]}'),
                RejectReason.RESULT_NOT_FINITE,
                id="result nested Infinity",
            ),
            pytest.param(
                make_fields(result="-Infinity"), RejectReason.RESULT_NOT_FINITE, id="result -inf"
            ),
            pytest.param(
                make_fields(result='{"score": 1e309}'),
                RejectReason.RESULT_NOT_FINITE,
                id="result 1e309",
            ),
            pytest.param(
                make_fields(stage="token", status="streaming"),
                RejectReason.MISSING_CONTENT,
                id="token without content",
            ),
            pytest.param(
                make_fields(stage="token", content="hi", attempt="one"),
                RejectReason.ATTEMPT_NOT_INTEGER,
                id="token attempt one",
            ),
            pytest.param(
                make_fields(stage="token", content="hi", attempt="-1"),
                RejectReason.ATTEMPT_NOT_INTEGER,
                id="token attempt -1",
            ),
        ],
    )
    def test_entry_is_rejected_with_its_reason(
        self, fields: dict[bytes, bytes], reason: RejectReason
    ) -> None:
        outcome = parse(fields)

        assert isinstance(outcome, Rejection)
        assert outcome.reason is reason
        assert outcome.detail

    def test_a_field_at_the_size_limit_passes_and_one_byte_more_does_not(self) -> None:
        at_limit = parse(make_fields(note="x" * 32), max_field_bytes=32)
        over = parse(make_fields(note="x" * 33), max_field_bytes=32)

        assert isinstance(at_limit, JobEvent)
        assert isinstance(over, Rejection)
        assert over.reason is RejectReason.FIELD_TOO_LARGE

    def test_the_detail_of_a_huge_seq_stays_short(self) -> None:
        outcome = parse(make_fields(seq="9" * 5000))

        assert isinstance(outcome, Rejection)
        assert len(outcome.detail) < 200

    def test_every_parsing_reason_is_covered_here(self) -> None:
        # max_deliveries and too_large (the routed size) are decided by the router.
        parsing_reasons = set(RejectReason) - {RejectReason.MAX_DELIVERIES, RejectReason.TOO_LARGE}
        covered = {
            reason
            for mark in self.test_entry_is_rejected_with_its_reason.pytestmark  # type: ignore[attr-defined]
            if mark.name == "parametrize"
            for _, reason in (p.values for p in mark.args[1])
        }

        assert covered == parsing_reasons


class TestValidEntries:
    def test_boundary_values_are_accepted(self) -> None:
        event = parsed_event(make_fields(job_id="A-z_0.9:" + "j" * 120, seq=MAX_SEQ, progress=0))

        assert len(event.job_id) == 128
        assert event.seq == MAX_SEQ
        assert event.progress == 0

    def test_seq_zero_is_accepted(self) -> None:
        assert parsed_event(make_fields(seq="0")).seq == 0

    def test_typed_fields_are_read(self) -> None:
        event = parsed_event(make_fields(seq="42", progress="-3", stage="analyse ✓"))

        assert (event.domain, event.stream, event.stream_id) == ("scan", STREAM, ENTRY_ID)
        assert (event.job_id, event.seq, event.progress) == ("job-1", 42, -3)
        assert (event.stage, event.status) == ("analyse ✓", "running")
        assert event.ts == "2024-05-01T12:00:00Z"

    def test_optional_fields_may_be_absent(self) -> None:
        event = parsed_event({b"job_id": b"job-1", b"seq": b"7"})

        assert (event.stage, event.status, event.ts, event.progress) == (None, None, None, None)
        assert event.has_result is False
        assert event.extra == {}

    def test_an_empty_progress_is_no_progress(self) -> None:
        assert parsed_event(make_fields(progress="")).progress is None

    def test_empty_optional_fields_are_absent_as_the_reference_producer_writes_them(
        self,
    ) -> None:
        # The reference design's producer writes every field, "" for the ones it has not got.
        event = parsed_event(
            make_fields(
                stage="",
                status="",
                ts="",
                progress="",
                result="",
                trace_id="",
                span_id="",
                traceparent="",
            )
        )

        assert (event.stage, event.status, event.ts, event.progress) == (None, None, None, None)
        assert event.has_result is False
        assert event.as_payload() == {
            "job_id": "job-1",
            "seq": 1,
            "stream_id": ENTRY_ID,
            "domain": "scan",
        }

    def test_a_result_of_large_finite_numbers_is_accepted(self) -> None:
        event = parsed_event(make_fields(result='{"big": 1e308, "small": -1e-320}'))

        assert event.result == {"big": 1e308, "small": -1e-320}

    def test_a_token_carries_its_content_node_and_attempt(self) -> None:
        event = parsed_event(
            make_fields(
                stage="token", status="streaming", content="안녕", node="answer", attempt="2"
            )
        )

        assert (event.is_token, event.content, event.node, event.attempt) == (
            True,
            "안녕",
            "answer",
            2,
        )

    def test_an_attempt_on_a_stage_event_is_the_producers_own_field(self) -> None:
        event = parsed_event(make_fields(attempt="first try"))

        assert (event.attempt, event.extra["attempt"]) == (0, "first try")

    def test_fields_the_router_sets_are_dropped_from_the_entry(self) -> None:
        event = parsed_event(make_fields(event_id="9", prev_event_id="8", restart="true"))

        assert not {"event_id", "prev_event_id", "restart"} & set(event.extra)

    def test_extra_fields_pass_through_as_text(self) -> None:
        event = parsed_event(make_fields(region="eu-west", attempt="2", empty=""))

        assert event.extra == {"region": "eu-west", "attempt": "2", "empty": ""}

    def test_result_is_decoded_from_json(self) -> None:
        event = parsed_event(make_fields(result='{"findings": [1, 2], "ok": true}'))

        assert event.has_result is True
        assert event.result == {"findings": [1, 2], "ok": True}

    def test_a_null_result_is_still_a_result(self) -> None:
        event = parsed_event(make_fields(result="null"))

        assert event.has_result is True
        assert event.result is None


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class TestTraceContext:
    def test_a_valid_traceparent_and_its_tracestate_pass_through(self) -> None:
        event = parsed_event(
            make_fields(traceparent=TRACEPARENT, tracestate="vendor=opaque", trace_id="4bf9")
        )

        assert event.as_payload()["traceparent"] == TRACEPARENT
        assert event.extra == {
            "traceparent": TRACEPARENT,
            "tracestate": "vendor=opaque",
            "trace_id": "4bf9",
        }

    def test_empty_trace_fields_are_dropped_not_published_empty(self) -> None:
        event = parsed_event(make_fields(traceparent="", tracestate="", trace_id="", span_id=""))

        assert event.extra == {}

    def test_a_traceparent_in_capitals_or_with_spaces_is_published_in_lowercase(self) -> None:
        event = parsed_event(make_fields(traceparent=f"  {TRACEPARENT.upper()} "))

        assert event.extra["traceparent"] == TRACEPARENT

    def test_a_later_version_may_carry_more_fields(self) -> None:
        later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds"

        assert parsed_event(make_fields(traceparent=later)).extra["traceparent"] == later

    @pytest.mark.parametrize(
        "malformed",
        [
            pytest.param("not a traceparent", id="text"),
            pytest.param(TRACEPARENT[:-1], id="short flags"),
            pytest.param(TRACEPARENT.replace("-", "_"), id="underscores"),
            pytest.param("ff" + TRACEPARENT[2:], id="version ff"),
            pytest.param(TRACEPARENT + "-extra", id="version 00 with more fields"),
            pytest.param(f"00-{'0' * 32}-00f067aa0ba902b7-01", id="zero trace id"),
            pytest.param(f"00-4bf92f3577b34da6a3ce929d0e0e4736-{'0' * 16}-01", id="zero parent"),
            pytest.param("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", id="non-hex"),
        ],
    )
    def test_a_malformed_traceparent_is_dropped_with_its_tracestate_and_the_event_kept(
        self, malformed: str
    ) -> None:
        event = parsed_event(
            make_fields(traceparent=malformed, tracestate="vendor=opaque", span_id="00f0")
        )

        assert event.extra == {"span_id": "00f0"}
        assert event.seq == 1


class TestPayload:
    def test_payload_has_typed_fields_extras_and_origin(self) -> None:
        event = parsed_event(
            make_fields(seq="5", progress="80", result='{"score": 0.5}', region="eu")
        )

        assert event.as_payload() == {
            "region": "eu",
            "job_id": "job-1",
            "seq": 5,
            "stage": "scan",
            "status": "running",
            "ts": "2024-05-01T12:00:00Z",
            "progress": 80,
            "result": {"score": 0.5},
            "stream_id": ENTRY_ID,
            "domain": "scan",
        }

    def test_payload_leaves_out_absent_fields(self) -> None:
        event = parsed_event({b"job_id": b"job-1", b"seq": b"7"})

        assert event.as_payload() == {
            "job_id": "job-1",
            "seq": 7,
            "stream_id": ENTRY_ID,
            "domain": "scan",
        }

    def test_a_null_result_is_kept_in_the_payload(self) -> None:
        payload = parsed_event(make_fields(result="null")).as_payload()

        assert "result" in payload
        assert payload["result"] is None

    def test_origin_fields_cannot_be_spoofed_by_extras(self) -> None:
        payload = parsed_event(make_fields(domain="chat", stream_id="0-1")).as_payload()

        assert (payload["domain"], payload["stream_id"]) == ("scan", ENTRY_ID)
