"""A job set's stream id: where each job stood, relative to the set; and frames retold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eco_router.domain.job_set import (
    MAX_SEQ,
    ForeignStreamId,
    JobSet,
    MalformedStreamId,
    encode_seq,
    max_stream_id_chars,
    read_stream_id,
    stream_id,
)
from eco_router.domain.multiplexed_frames import job_frame
from eco_router.domain.sse import IDLE_NOTICE, GatewayEvent, live_frame

SET = JobSet.of([("scan", "b"), ("chat", "a"), ("scan", "a"), ("scan", "b")])


class TestJobSet:
    def test_it_is_distinct_and_in_one_order_whatever_order_it_was_named_in(self) -> None:
        assert SET.jobs == (("chat", "a"), ("scan", "a"), ("scan", "b"))
        assert JobSet.of(reversed(SET.jobs)).fingerprint == SET.fingerprint

    def test_another_set_has_another_fingerprint(self) -> None:
        assert JobSet.of([("scan", "a")]).fingerprint != SET.fingerprint
        assert JobSet.of([("chat", "a"), ("scan", "a")]).fingerprint != SET.fingerprint


seqs = st.one_of(st.none(), st.integers(min_value=0, max_value=MAX_SEQ))


class TestStreamId:
    @given(st.lists(seqs, min_size=3, max_size=3))
    def test_it_reads_back_what_it_wrote(self, positions: list[int | None]) -> None:
        value = stream_id(SET, [encode_seq(p) for p in positions])
        assert read_stream_id(SET, value) == positions
        assert len(value) <= max_stream_id_chars(len(SET))

    def test_fifty_jobs_at_high_seqs_fit_a_header_of_seven_hundred_bytes(self) -> None:
        job_set = JobSet.of(("scan", f"job-{i}") for i in range(50))
        value = stream_id(job_set, [encode_seq(MAX_SEQ)] * 50)
        assert len(value) <= max_stream_id_chars(50) <= 709

    def test_an_id_of_another_set_is_foreign(self) -> None:
        other = JobSet.of([("scan", "x"), ("scan", "y"), ("scan", "z")])
        with pytest.raises(ForeignStreamId, match="another set of jobs"):
            read_stream_id(SET, stream_id(other, ["1", "2", "3"]))

    @pytest.mark.parametrize(
        "value",
        [
            "12",  # a single job's id
            "nodot",
            "short.1,2,3",
            f"{SET.fingerprint}.1,2",  # one position short
            f"{SET.fingerprint}.1,2,3,4",
            f"{SET.fingerprint}.1,-2,3",
            f"{SET.fingerprint}.1,2,{'z' * 13}",  # past 2^63-1
            f"{SET.fingerprint}.1,2,{'1' * 14}",
            f"{SET.fingerprint}.1,2,3" + "," * 100,
        ],
    )
    def test_anything_else_is_malformed(self, value: str) -> None:
        with pytest.raises(MalformedStreamId):
            read_stream_id(SET, value)


class TestFramesRetold:
    def test_a_jobs_frames_keep_their_name_and_data_and_take_the_sets_id(self) -> None:
        event = GatewayEvent(event_id=7, stage="vision", status="running", data=b'{"seq":7}')

        retold = job_frame(live_frame(event), domain="scan", job_id="J", stream_id="f.7")

        assert retold.encoded == (
            b'id: f.7\nevent: vision\ndata: {"domain":"scan","job_id":"J","data":{"seq":7}}\n\n'
        )
        assert (retold.event_id, retold.name) == (7, "vision")

    def test_a_notice_is_retold_with_the_job_named(self) -> None:
        retold = job_frame(IDLE_NOTICE, domain="scan", job_id="J", stream_id="f.7")

        assert retold.encoded == (
            b"id: f.7\nevent: error\n"
            b'data: {"domain":"scan","job_id":"J","data":{"error":"idle"}}\n\n'
        )
        assert retold.event_id is None
