"""The producer's rules: the deterministic seq, validation before any I/O, the shard and key."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from eco_router.domain.progress import (
    InvalidProgressEvent,
    StageEvent,
    StagePlan,
    Status,
    progress_event,
)
from eco_router.domain.streams import StreamFamily
from eco_router.producer import ProducerConfig, producer_config

DEFAULT_PLAN = StagePlan()
CONFIG = ProducerConfig(family=StreamFamily("scan:events", 4))


def md5_shard(job_id: str, shards: int) -> int:
    """The documented shard rule, written out independently of the code under test."""
    digest = hashlib.md5(job_id.encode()).digest()
    return int.from_bytes(digest[:8], byteorder="big") % shards


def call_fields(**overrides: Any) -> dict[str, str]:
    """The entry fields `ProducerConfig.stage_event` prepares for a valid event, with overrides."""
    values: dict[str, Any] = {"job_id": "job-1", "stage": "vision", "status": "started"}
    values.update(overrides)
    job_id, stage, status = values.pop("job_id"), values.pop("stage"), values.pop("status")
    return CONFIG.stage_event(StageEvent(job_id, stage, status, **values)).fields


class TestTheDefaultPlanFixesEverySeq:
    @pytest.mark.parametrize(
        ("stage", "status", "seq"),
        [
            ("queued", "queued", 0),
            ("vision", "started", 10),
            ("vision", "completed", 11),
            ("vision", "failed", 12),
            ("rule", "started", 20),
            ("rule", "completed", 21),
            ("rule", "failed", 22),
            ("answer", "started", 30),
            ("answer", "completed", 31),
            ("answer", "failed", 32),
            ("reward", "started", 40),
            ("reward", "completed", 41),
            ("reward", "failed", 42),
            ("done", "done", 51),
        ],
    )
    def test_each_stage_and_status_has_its_seq(self, stage: str, status: str, seq: int) -> None:
        assert progress_event("job-1", stage, status, plan=DEFAULT_PLAN).seq == seq

    def test_failed_never_collides_with_started_or_completed(self) -> None:
        seqs = [
            DEFAULT_PLAN.seq_for(stage, status)
            for stage in DEFAULT_PLAN.stages
            for status in (Status.STARTED, Status.COMPLETED, Status.FAILED)
        ]
        assert len(set(seqs)) == len(seqs)
        assert DEFAULT_PLAN.seq_for("vision", Status.FAILED) != DEFAULT_PLAN.seq_for(
            "vision", Status.STARTED
        )

    def test_done_comes_after_every_other_seq(self) -> None:
        others = [
            DEFAULT_PLAN.seq_for(stage, status)
            for stage in DEFAULT_PLAN.stages
            for status in (Status.STARTED, Status.COMPLETED, Status.FAILED)
        ]
        assert DEFAULT_PLAN.done_seq > max(others)

    def test_queued_and_done_take_their_seq_whatever_the_stage_name(self) -> None:
        assert progress_event("job-1", "intake", "queued", plan=DEFAULT_PLAN).seq == 0
        assert progress_event("job-1", "finish", "done", plan=DEFAULT_PLAN).seq == 51

    def test_a_retried_call_gets_the_same_seq(self) -> None:
        first = progress_event("job-1", "answer", "completed", plan=DEFAULT_PLAN, progress=60)
        again = progress_event("job-1", "answer", "completed", plan=DEFAULT_PLAN, progress=60)
        assert first == again


class TestCustomPlansAndExplicitSeqs:
    def test_a_custom_plan_numbers_its_own_stages(self) -> None:
        plan = StagePlan(("ocr", "classify"))
        assert progress_event("job-1", "ocr", "started", plan=plan).seq == 10
        assert progress_event("job-1", "classify", "completed", plan=plan).seq == 21
        assert progress_event("job-1", "classify", "failed", plan=plan).seq == 22
        assert progress_event("job-1", "done", "done", plan=plan).seq == 31

    def test_producer_config_builds_the_plan_from_the_stage_names(self) -> None:
        config = producer_config(domain="chat", shards=2, stages=("draft", "review", "send"))
        assert config.plan.done_seq == 41
        assert config.family == StreamFamily("chat:events", 2)

    def test_an_explicit_seq_is_honoured(self) -> None:
        assert progress_event("job-1", "vision", "started", plan=DEFAULT_PLAN, seq=7).seq == 7

    def test_a_stage_outside_the_plan_is_accepted_with_an_explicit_seq(self) -> None:
        event = progress_event("job-1", "upload", "completed", plan=DEFAULT_PLAN, seq=3)
        assert (event.stage, event.seq) == ("upload", 3)

    def test_a_stage_outside_the_plan_without_a_seq_is_refused(self) -> None:
        with pytest.raises(InvalidProgressEvent, match="'upload' is not in the plan"):
            progress_event("job-1", "upload", "completed", plan=DEFAULT_PLAN)

    @pytest.mark.parametrize("seq", [-1, 2**53, True, 1.0])
    def test_an_explicit_seq_out_of_range_or_not_an_integer_is_refused(self, seq: Any) -> None:
        with pytest.raises(InvalidProgressEvent, match=r"seq .* must be an integer"):
            progress_event("job-1", "vision", "started", plan=DEFAULT_PLAN, seq=seq)

    @pytest.mark.parametrize("stages", [(), ("ocr", "ocr")])
    def test_a_plan_without_distinct_stages_is_refused(self, stages: tuple[str, ...]) -> None:
        with pytest.raises(InvalidProgressEvent, match="distinct, non-empty"):
            StagePlan(stages)


class TestBadInputIsRefusedBeforeAnyWrite:
    @pytest.mark.parametrize(
        "job_id",
        ["", "j" * 129, "job 1", "job{1}", "job*", "job-1\n"],
        ids=["empty", "129-chars", "space", "brace", "star", "newline"],
    )
    def test_a_job_id_outside_the_allowed_characters_is_refused(self, job_id: str) -> None:
        with pytest.raises(InvalidProgressEvent, match=r"job_id .* must be 1-128 characters"):
            CONFIG.stage_event(StageEvent(job_id, "vision", "started"))

    def test_a_128_character_job_id_is_the_longest_accepted(self) -> None:
        job_id = "j" * 128
        assert call_fields(job_id=job_id)["job_id"] == job_id

    def test_an_unknown_status_is_refused_naming_the_known_ones(self) -> None:
        with pytest.raises(InvalidProgressEvent, match=r"unknown status 'running'.*'started'"):
            CONFIG.stage_event(StageEvent("job-1", "vision", "running"))

    @pytest.mark.parametrize("stage", ["", "vision\nevent: done", "a:b", "x" * 65])
    def test_a_stage_outside_the_name_pattern_is_refused(self, stage: str) -> None:
        with pytest.raises(InvalidProgressEvent, match="must be 1-64 characters"):
            CONFIG.stage_event(StageEvent("job-1", stage, "started", seq=5))

    @pytest.mark.parametrize("progress", [-1, 101, 5.5, True])
    def test_a_progress_that_is_not_an_integer_from_0_to_100_is_refused(
        self, progress: Any
    ) -> None:
        with pytest.raises(InvalidProgressEvent, match="must be an integer from 0 to 100"):
            CONFIG.stage_event(StageEvent("job-1", "vision", "started", progress=progress))

    @pytest.mark.parametrize("progress", [0, 100])
    def test_progress_bounds_are_accepted(self, progress: int) -> None:
        assert call_fields(progress=progress)["progress"] == str(progress)

    @pytest.mark.parametrize(
        "result",
        [float("nan"), float("inf"), {"label": "cat", "score": float("nan")}, [1, [float("-inf")]]],
        ids=["nan", "infinity", "nested-nan", "nested-infinity"],
    )
    def test_a_result_holding_nan_or_infinity_is_refused(self, result: Any) -> None:
        # orjson would write these as null: refusing is the only way not to change the data.
        with pytest.raises(InvalidProgressEvent, match="no NaN or infinity"):
            CONFIG.stage_event(StageEvent("job-1", "done", "done", result=result))

    @pytest.mark.parametrize("result", [object(), {1, 2}], ids=["object", "set"])
    def test_a_result_orjson_cannot_encode_is_refused(self, result: Any) -> None:
        with pytest.raises(InvalidProgressEvent, match="result is not JSON-encodable"):
            CONFIG.stage_event(StageEvent("job-1", "done", "done", result=result))


class TestTheEncodedEntry:
    def test_the_fields_carry_the_event_and_the_seq_as_text(self) -> None:
        fields = call_fields(stage="rule", status="completed", progress=40)
        assert {k: v for k, v in fields.items() if k != "ts"} == {
            "job_id": "job-1",
            "stage": "rule",
            "status": "completed",
            "seq": "21",
            "progress": "40",
        }
        assert float(fields["ts"]) > 0

    def test_the_result_is_json_with_non_ascii_kept_as_is(self) -> None:
        result = {"label": "chat noir 🐈", "score": 0.9, "tags": ["ça", None]}
        fields = call_fields(stage="done", status="done", result=result)
        assert "chat noir 🐈" in fields["result"]
        assert orjson.loads(fields["result"]) == result

    def test_an_event_without_result_or_progress_writes_neither_field(self) -> None:
        assert set(call_fields()) == {"job_id", "stage", "status", "seq", "ts"}


# Pinned: producers in other languages implement the same rule and must agree with these.
SHARDS_OF = {
    "job-13": (0, 0),
    "job-0": (1, 1),
    "job-5": (2, 2),
    "job-2": (3, 3),
    "job-8": (0, 4),
    "job-7": (1, 5),
    "job-1": (2, 6),
    "job-4": (3, 7),
    "tenant:acme:job_9": (0, 0),
    "x.y-z_0": (3, 7),
}


class TestTheShardAndTheIdempotencyKey:
    def test_the_pinned_table_follows_the_md5_rule(self) -> None:
        assert {job: (md5_shard(job, 4), md5_shard(job, 8)) for job in SHARDS_OF} == SHARDS_OF

    @pytest.mark.parametrize(("job_id", "expected"), SHARDS_OF.items())
    @pytest.mark.parametrize("shards", [4, 8])
    def test_the_call_targets_the_md5_shard_of_the_job(
        self, job_id: str, expected: tuple[int, int], shards: int
    ) -> None:
        shard = expected[0] if shards == 4 else expected[1]
        config = ProducerConfig(family=StreamFamily("scan:events", shards))
        entry = config.stage_event(StageEvent(job_id, "answer", "failed"))
        assert (entry.stream, entry.idempotency_key) == (
            f"scan:events:{shard}",
            f"{{scan:events:{shard}}}:once:{len(job_id)}:{job_id}:answer:failed",
        )

    def test_every_shard_is_used(self) -> None:
        streams = {
            ProducerConfig(family=StreamFamily("scan:events", 8))
            .stage_event(StageEvent(job, "x", "queued"))
            .stream
            for job in SHARDS_OF
        }
        assert streams == {f"scan:events:{n}" for n in range(8)}

    def test_the_key_ignores_progress_and_result_so_a_retry_is_the_same_event(self) -> None:
        first = CONFIG.stage_event(
            StageEvent("job-1", "done", "done", progress=99, result={"a": 1})
        )
        retry = CONFIG.stage_event(
            StageEvent("job-1", "done", "done", progress=100, result={"a": 2})
        )
        assert first.idempotency_key == retry.idempotency_key

    def test_each_status_of_a_stage_has_its_own_key(self) -> None:
        # `streaming` is a token's, `cancelled` the stage `done`'s only.
        statuses = [s for s in Status if s not in (Status.STREAMING, Status.CANCELLED)]
        keys = {
            CONFIG.stage_event(StageEvent("job-1", "vision", status)).idempotency_key
            for status in statuses
        }
        assert len(keys) == len(statuses)

    def test_a_cancelled_done_is_the_done_seq_and_its_own_key(self) -> None:
        cancelled = CONFIG.stage_event(StageEvent("job-1", "done", "cancelled"))
        done = CONFIG.stage_event(StageEvent("job-1", "done", "done"))

        assert cancelled.fields["seq"] == done.fields["seq"] == "51"
        assert cancelled.idempotency_key != done.idempotency_key

    def test_cancelled_is_for_the_stage_done_only(self) -> None:
        with pytest.raises(
            InvalidProgressEvent, match="status 'cancelled' is for the stage 'done'"
        ):
            CONFIG.stage_event(StageEvent("job-1", "vision", "cancelled"))


class TestIdempotencyKeysAreUnambiguous:
    def test_colons_in_job_ids_cannot_make_two_events_share_a_key(self) -> None:
        first = CONFIG.stage_event(StageEvent("a:b", "c", "started", seq=1))
        second = CONFIG.stage_event(StageEvent("a", "b", "started", seq=1))
        assert first.idempotency_key.split(":once:")[1] != second.idempotency_key.split(":once:")[1]
        assert first.idempotency_key.endswith(":once:3:a:b:c:started")
