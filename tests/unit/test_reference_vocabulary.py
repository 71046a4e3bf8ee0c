"""The reference design's vocabulary: ("queued", "started") and ("done", "completed") are the
job's queued and done events, beside the SDK's own ("queued", "queued") and ("done", "done")."""

from __future__ import annotations

import re

import orjson
import pytest

from eco_router.domain.event import JobEvent
from eco_router.domain.parsing import parse_entry
from eco_router.domain.progress import InvalidProgressEvent, StageEvent, StagePlan, progress_event
from eco_router.domain.sse import GatewayEvent
from eco_router.domain.streams import StreamFamily
from eco_router.producer import ProducerConfig

PLAN = StagePlan()
CONFIG = ProducerConfig(family=StreamFamily("scan:events", 4))
KOREAN_RESULT = {"answer": "정상입니다", "category": "플라스틱"}


def routed(fields: dict[str, str]) -> JobEvent:
    event = parse_entry(
        domain="scan",
        stream="scan:events:0",
        entry_id="1-0",
        fields={k.encode(): v.encode() for k, v in fields.items()},
    )
    assert isinstance(event, JobEvent), event
    return event


def gateway_event(event: JobEvent) -> GatewayEvent:
    return GatewayEvent(
        event_id=event.seq,
        stage=event.stage,
        status=event.status,
        data=orjson.dumps(event.as_payload()),
    )


class TestSeqs:
    @pytest.mark.parametrize(
        ("stage", "status", "seq"),
        [
            ("queued", "started", 0),
            ("queued", "queued", 0),
            ("done", "completed", 51),
            ("done", "done", 51),
        ],
    )
    def test_both_vocabularies_give_queued_and_done_their_seq(
        self, stage: str, status: str, seq: int
    ) -> None:
        assert progress_event("job-1", stage, status, plan=PLAN).seq == seq

    def test_done_completed_follows_the_plan_length(self) -> None:
        plan = StagePlan(("ocr", "classify"))

        assert progress_event("job-1", "done", "completed", plan=plan).seq == 31

    @pytest.mark.parametrize(
        ("stage", "status", "message"),
        [
            ("queued", "completed", "stage 'queued' takes status 'started' (or 'queued')"),
            ("queued", "failed", "stage 'queued' takes status 'started' (or 'queued')"),
            ("done", "started", "stage 'done' takes status 'completed' (or 'done')"),
            ("done", "failed", "report a failure on the stage that failed"),
        ],
    )
    def test_any_other_status_of_the_pseudo_stages_is_refused(
        self, stage: str, status: str, message: str
    ) -> None:
        with pytest.raises(InvalidProgressEvent, match=re.escape(message)):
            progress_event("job-1", stage, status, plan=PLAN)


class TestIdempotency:
    def test_a_retried_done_completed_is_the_same_event(self) -> None:
        first = progress_event("job-1", "done", "completed", plan=PLAN, result=KOREAN_RESULT)
        again = progress_event("job-1", "done", "completed", plan=PLAN, result=KOREAN_RESULT)

        assert first.idempotency_suffix == again.idempotency_suffix

    def test_either_spelling_of_queued_and_of_done_is_the_same_event(self) -> None:
        def suffix(stage: str, status: str) -> str:
            return progress_event("job-1", stage, status, plan=PLAN).idempotency_suffix

        assert suffix("done", "completed") == suffix("done", "done")
        assert suffix("queued", "started") == suffix("queued", "queued")
        assert suffix("done", "completed") != suffix("reward", "completed")
        assert suffix("queued", "started") != suffix("vision", "started")


class TestWhatIsWrittenAndRouted:
    def test_the_entry_keeps_the_status_result_and_progress_as_sent(self) -> None:
        fields = CONFIG.stage_event(
            StageEvent("job-1", "done", "completed", result=KOREAN_RESULT, progress=100)
        ).fields

        assert (fields["stage"], fields["status"], fields["seq"]) == ("done", "completed", "51")
        assert fields["progress"] == "100"
        assert orjson.loads(fields["result"]) == KOREAN_RESULT
        assert "정상입니다" in fields["result"]

    def test_queued_started_is_routed_as_the_queued_event(self) -> None:
        fields = CONFIG.stage_event(StageEvent("job-1", "queued", "started", progress=0)).fields
        event = routed(fields)

        assert (event.seq, event.stage, event.status, event.progress) == (0, "queued", "started", 0)
        assert not event.is_terminal
        assert gateway_event(event).name == "queued"
        assert not gateway_event(event).terminal

    def test_done_completed_is_routed_as_the_done_event_and_ends_the_stream(self) -> None:
        event = routed(
            CONFIG.stage_event(
                StageEvent("job-1", "done", "completed", result=KOREAN_RESULT)
            ).fields
        )

        assert (event.seq, event.result) == (51, KOREAN_RESULT)
        assert event.is_terminal
        assert gateway_event(event).name == "done"
        assert gateway_event(event).terminal
        assert orjson.loads(gateway_event(event).data)["result"] == KOREAN_RESULT

    def test_a_failed_stage_is_an_error_event_with_its_own_seq(self) -> None:
        event = routed(
            CONFIG.stage_event(
                StageEvent("job-1", "vision", "failed", result={"error": "시간 초과"})
            ).fields
        )

        assert event.seq == 12
        assert gateway_event(event).name == "error"
