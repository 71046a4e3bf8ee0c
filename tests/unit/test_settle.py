"""`settle`: a batch against its jobs' records gives the verdicts, stamps and one write per
job changed; the stores' agreement is `tests/integration/test_settle_differential.py`'s."""

from __future__ import annotations

from typing import Any

from eco_router.application.port_values import EncodedEvent
from eco_router.domain.settle import (
    Limits,
    Marker,
    StoredJob,
    StoredText,
    gone_candidates,
    settle,
)
from eco_router.domain.text import TextRun
from eco_router.domain.verdict import (
    DUPLICATE,
    NEW_APPLY,
    NEW_IN_PLACE_OF_GONE,
    NEW_REPUBLISH,
    STALE,
    TEXT_FILLED,
)
from tests.contracts.factories import encoded, entry_id

LIMITS = Limits(history_size=3, history_max_bytes=1 << 20, text_max_bytes=1 << 20)
JOB = ("scan", "job-1")
CHAT = ("chat", "job-1")


def stage(seq: int, **overrides: Any) -> EncodedEvent:
    return encoded(**{"seq": seq, "stream_id": entry_id(seq)} | overrides)


def token(seq: int, content: str, **overrides: Any) -> EncodedEvent:
    fields = {"domain": "chat", "stream": "chat:events:0", "stage": "token"}
    extra = {"content": content} | ({"node": overrides.pop("node")} if "node" in overrides else {})
    return encoded(**fields | {"seq": seq, "stream_id": entry_id(seq), "extra": extra} | overrides)


class TestSettle:
    def test_a_jobs_events_make_one_write_with_the_oldest_payloads_dropped(self) -> None:
        settled = settle([stage(n) for n in (1, 2, 3, 4)], {}, LIMITS)

        assert settled.judgements == [NEW_APPLY] * 4
        [write] = settled.writes
        assert (len(write.appended), write.dropped) == (4, 1)
        assert write.state == write.appended[-1]
        assert write.record.last_seq == 4
        assert sorted(write.record.markers) == [1, 2, 3, 4]
        assert write.record.history_sizes == tuple(len(p) for p in write.appended[1:])

    def test_dropping_counts_the_payloads_already_kept(self) -> None:
        record = StoredJob(last_seq=1, last_id=1, history_sizes=(10, 10, 10))

        settled = settle([stage(2)], {JOB: record}, LIMITS)

        assert settled.writes[0].dropped == 1

    def test_the_history_drops_the_oldest_payloads_until_its_bytes_fit(self) -> None:
        record = StoredJob(last_seq=1, last_id=1, history_sizes=(100, 100, 100))
        size = len(stage(2).payload) + len(b'"event_id":2,"prev_event_id":1,')
        limits = Limits(history_size=10, history_max_bytes=100 + size, text_max_bytes=1 << 20)

        [write] = settle([stage(2)], {JOB: record}, limits).writes

        assert (write.dropped, write.record.history_sizes) == (2, (100, size))

    def test_the_newest_payload_stays_even_when_it_alone_is_too_big(self) -> None:
        record = StoredJob(last_seq=1, last_id=1, history_sizes=(100, 100))
        limits = Limits(history_size=10, history_max_bytes=10, text_max_bytes=1 << 20)

        [write] = settle([stage(2)], {JOB: record}, limits).writes

        assert (write.dropped, write.record.history_sizes) == (2, (len(write.appended[0]),))

    def test_nothing_judged_new_writes_nothing(self) -> None:
        record = StoredJob(last_seq=5, last_id=5, markers={5: Marker(entry_id(5), b"x")})

        settled = settle([stage(4), stage(5, stream_id=entry_id(9))], {JOB: record}, LIMITS)

        assert settled.judgements == [STALE, DUPLICATE]
        assert settled.writes == []

    def test_an_entry_read_again_publishes_with_its_first_stamp(self) -> None:
        record = StoredJob(last_seq=5, last_id=7, markers={5: Marker(entry_id(5), b"first,")})

        settled = settle([stage(5)], {JOB: record}, LIMITS)

        assert (settled.judgements, settled.stamps) == ([NEW_REPUBLISH], [b"first,"])

    def test_an_entry_in_place_of_a_gone_one_takes_its_marker_and_stamp(self) -> None:
        record = StoredJob(last_seq=5, last_id=5, markers={5: Marker(entry_id(50), b"first,")})

        settled = settle([stage(5)], {JOB: record}, LIMITS, gone=frozenset({entry_id(50)}))

        assert (settled.judgements, settled.stamps) == ([NEW_IN_PLACE_OF_GONE], [b"first,"])
        assert settled.writes[0].markers == {5: Marker(entry_id(5), b"first,")}

    def test_a_node_run_closes_when_another_node_writes_and_an_empty_one_leaves_none(
        self,
    ) -> None:
        settled = settle(
            [token(1001, "", node="plan"), token(1002, "ab", node="act"), token(1003, "c")],
            {},
            LIMITS,
        )

        text = settled.writes[0].record.text
        assert text is not None
        assert (text.content, text.spans()) == (b"abc", (TextRun("act", 0, 2),))

    def test_tokens_fill_the_text_counting_those_of_the_same_batch(self) -> None:
        limits = Limits(history_size=3, history_max_bytes=1 << 20, text_max_bytes=4)
        record = StoredJob(last_id=1001, text=StoredText(0, 1001, 1001, entry_id(1), b"ab", 2))

        settled = settle([token(1002, "c"), token(1003, "de")], {CHAT: record}, limits)

        assert settled.judgements == [NEW_APPLY, TEXT_FILLED]
        write = settled.writes[0]
        assert (write.text_restarted, write.text_appended) == (False, b"c")
        assert write.record.text == StoredText(0, 1002, 1002, entry_id(1002), b"abc", 3, full=True)


class TestGoneCandidates:
    def test_the_records_other_entries_and_the_batchs_shared_seqs_are_asked(self) -> None:
        record = StoredJob(last_seq=5, markers={5: Marker(entry_id(50), b"")})
        batch = [stage(5), stage(6), stage(7), stage(7, stream_id=entry_id(70))]

        asked = gone_candidates(batch, {JOB: record})

        stream = "scan:events:0"
        assert asked == {(stream, entry_id(50)), (stream, entry_id(7)), (stream, entry_id(70))}

    def test_an_entry_marking_its_own_seq_and_tokens_are_not_asked(self) -> None:
        record = StoredJob(last_seq=5, markers={5: Marker(entry_id(5), b"")})

        assert gone_candidates([stage(5), token(1001, "a")], {JOB: record}) == set()
