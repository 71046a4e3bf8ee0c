"""The verdict rules, the judging order, and the ordering guarantee they give together."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eco_router.domain.event import JobEvent, ends_job
from eco_router.domain.text import TextRecord
from eco_router.domain.verdict import (
    DUPLICATE,
    NEW_APPLY,
    NEW_IN_PLACE_OF_GONE,
    NEW_REPUBLISH,
    NEW_RESTART,
    STALE,
    STALE_AFTER_END,
    JobRecord,
    Judgement,
    Verdict,
    in_judging_order,
    judge,
)
from tests.unit.factories import START_MS, Harness, make_event

E3, E5, OTHER = "1700000000000-3", "1700000000000-5", "1700000000009-0"


class TestJudge:
    @pytest.mark.parametrize(
        ("record", "stream_id", "seq", "expected"),
        [
            pytest.param(JobRecord(), OTHER, 1, NEW_APPLY, id="first event of a job is NEW"),
            pytest.param(JobRecord(), OTHER, 0, NEW_APPLY, id="seq 0 of an unknown job is NEW"),
            pytest.param(
                JobRecord(3, {3: E3}), OTHER, 4, NEW_APPLY, id="a higher seq is NEW and applied"
            ),
            pytest.param(JobRecord(3, None), OTHER, 9, NEW_APPLY, id="a gap in seqs is still NEW"),
            pytest.param(
                JobRecord(3, {3: E3}), E3, 3, NEW_REPUBLISH, id="the applying entry again"
            ),
            pytest.param(
                JobRecord(5, {3: E3, 5: E5}),
                E3,
                3,
                NEW_REPUBLISH,
                id="the applying entry again after newer seqs",
            ),
            pytest.param(
                JobRecord(3, {3: E3}), OTHER, 3, DUPLICATE, id="another entry with an applied seq"
            ),
            pytest.param(
                JobRecord(5, {3: E3, 5: E5}),
                OTHER,
                3,
                DUPLICATE,
                id="another entry with an older applied seq",
            ),
            pytest.param(
                JobRecord(5, {3: E3, 5: E5}, frozenset({E3})),
                OTHER,
                3,
                NEW_IN_PLACE_OF_GONE,
                id="another entry with a seq applied by an entry the stream lost",
            ),
            pytest.param(
                JobRecord(5, {3: E3, 5: E5}, frozenset({E5})),
                OTHER,
                3,
                DUPLICATE,
                id="another entry with a seq applied by an entry still held",
            ),
            pytest.param(
                JobRecord(5, {3: E3, 5: E5}, frozenset({E3})),
                E3,
                3,
                NEW_REPUBLISH,
                id="the applying entry itself, listed gone, is republished",
            ),
            pytest.param(JobRecord(5, {5: E5}), OTHER, 4, STALE, id="an older seq never applied"),
            pytest.param(
                JobRecord(5, None), OTHER, 5, STALE, id="equal seq without its marker is STALE"
            ),
            pytest.param(JobRecord(0, {}), OTHER, 0, STALE, id="equal seq 0 is STALE"),
        ],
    )
    def test_verdict_table(
        self, record: JobRecord, stream_id: str, seq: int, expected: Judgement
    ) -> None:
        assert judge(make_event(stream_id=stream_id, seq=seq), record) == expected

    @pytest.mark.parametrize(
        ("judgement", "publish"),
        [(NEW_APPLY, True), (NEW_REPUBLISH, True), (DUPLICATE, False), (STALE, False)],
    )
    def test_only_new_events_are_published(self, judgement: Judgement, publish: bool) -> None:
        assert judgement.publish is publish

    def test_only_a_first_application_changes_the_state(self) -> None:
        assert [j.apply for j in (NEW_APPLY, NEW_REPUBLISH, DUPLICATE, STALE)] == [
            True,
            False,
            False,
            False,
        ]


def make_token(seq: int, *, attempt: int = 0, content: str = "x") -> JobEvent:
    return make_event(
        stage="token", status="streaming", seq=seq, attempt=attempt, extra={"content": content}
    )


# "Hello world" of attempt 0, up to token 1003.
HELLO_WORLD = TextRecord(attempt=0, last_seq=1003, size=11)


class TestJudgeToken:
    @pytest.mark.parametrize(
        ("record", "token", "expected"),
        [
            pytest.param(JobRecord(text=HELLO_WORLD), make_token(1004), NEW_APPLY, id="next"),
            pytest.param(
                JobRecord(text=HELLO_WORLD, ended=True),
                make_token(1004),
                STALE_AFTER_END,
                id="the first after the end: STALE, told apart",
            ),
            pytest.param(
                JobRecord(text=HELLO_WORLD, ended=True, written_after_end=True),
                make_token(1005),
                STALE,
                id="a later one after the end: STALE",
            ),
            pytest.param(
                JobRecord(text=HELLO_WORLD, ended=True),
                make_token(1003),
                DUPLICATE,
                id="written again after the end: still a DUPLICATE",
            ),
            pytest.param(
                JobRecord(text=HELLO_WORLD, ended=True),
                make_token(1001, attempt=1),
                STALE_AFTER_END,
                id="a newer attempt after the end restarts nothing",
            ),
            pytest.param(
                JobRecord(text=TextRecord(attempt=1, last_seq=1001, size=1), ended=True),
                make_token(1002, attempt=0),
                STALE,
                id="an older attempt after the end: STALE as before it",
            ),
            pytest.param(
                JobRecord(ended=True),
                make_token(1001),
                STALE_AFTER_END,
                id="the first token of a job that ended without text",
            ),
            pytest.param(
                JobRecord(text=TextRecord(attempt=0, last_seq=1001, size=1, full=True), ended=True),
                make_token(1002),
                STALE_AFTER_END,
                id="after the end of a full text: STALE, not TEXT_FULL",
            ),
            pytest.param(
                JobRecord(text=HELLO_WORLD),
                make_token(1001, attempt=1),
                NEW_RESTART,
                id="a newer attempt before the end restarts the text",
            ),
        ],
    )
    def test_token_table(self, record: JobRecord, token: JobEvent, expected: Judgement) -> None:
        assert judge(token, record) == expected

    @pytest.mark.parametrize(
        ("stage", "status", "ends"),
        [
            ("done", "completed", True),
            ("done", "done", True),
            ("answer", "done", True),
            ("answer", "failed", True),
            ("answer", "completed", False),
            ("needs_input", "waiting", False),
            (None, None, False),
        ],
    )
    def test_done_or_a_failure_ends_the_job(
        self, stage: str | None, status: str | None, ends: bool
    ) -> None:
        assert ends_job(stage, status) is ends
        assert make_event(stage=stage, status=status).is_terminal is ends


class TestInJudgingOrder:
    def test_each_jobs_events_are_sorted_by_seq(self) -> None:
        events = [make_event(seq=s, stream_id=f"{START_MS}-{i}") for i, s in enumerate([3, 1, 2])]

        assert [e.seq for e in in_judging_order(events)] == [1, 2, 3]

    def test_jobs_keep_their_first_seen_order(self) -> None:
        events = [
            make_event(job_id="b", seq=2),
            make_event(job_id="a", seq=9),
            make_event(job_id="b", seq=1),
            make_event(job_id="a", seq=4),
        ]

        ordered = [(e.job_id, e.seq) for e in in_judging_order(events)]

        assert ordered == [("b", 1), ("b", 2), ("a", 4), ("a", 9)]

    def test_the_same_job_id_in_two_domains_is_two_jobs(self) -> None:
        events = [
            make_event(domain="scan", seq=2),
            make_event(domain="chat", seq=1),
            make_event(domain="scan", seq=1),
        ]

        ordered = [(e.domain, e.seq) for e in in_judging_order(events)]

        assert ordered == [("scan", 1), ("scan", 2), ("chat", 1)]

    def test_entries_with_equal_seqs_keep_their_arrival_order(self) -> None:
        events = [make_event(seq=1, stream_id=f"{START_MS}-{i}") for i in (7, 2, 5)]

        assert [e.stream_id for e in in_judging_order(events)] == [
            f"{START_MS}-{i}" for i in (7, 2, 5)
        ]

    def test_an_empty_batch_stays_empty(self) -> None:
        assert in_judging_order([]) == []


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[list[int], list[JobEvent]]:
    """A job's seqs in any order with repeats, each its own entry, plus exact redeliveries."""
    seqs = draw(st.lists(st.integers(0, 20), min_size=1, max_size=25))
    entries = [make_event(seq=s, stream_id=f"{START_MS}-{i}") for i, s in enumerate(seqs)]
    order = list(entries)
    for index, where in draw(st.lists(st.tuples(st.integers(0, len(entries) - 1), st.integers(0)))):
        # A redelivery comes back after the first delivery of the same entry.
        first = order.index(entries[index])
        order.insert(first + 1 + where % (len(order) - first), entries[index])
    return seqs, order


class TestOrderingGuarantee:
    @given(arrivals())
    def test_applied_seqs_strictly_increase_and_end_at_the_highest(
        self, case: tuple[list[int], list[JobEvent]]
    ) -> None:
        seqs, order = case
        last_seq: int | None = None
        applied_by: dict[int, str] = {}
        published: list[int] = []
        for event in order:
            judgement = judge(event, JobRecord(last_seq, dict(applied_by)))
            if judgement.apply:  # what the state store does with NEW_APPLY
                last_seq = event.seq
                applied_by[event.seq] = event.stream_id
                published.append(event.seq)
            elif judgement.verdict is Verdict.NEW:
                assert applied_by[event.seq] == event.stream_id

        assert published == sorted(set(published))
        assert last_seq == max(seqs)
        assert published[-1] == max(seqs)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        seqs=st.lists(st.integers(0, 12), min_size=1, max_size=30),
        batch_sizes=st.lists(st.integers(1, 7), min_size=1, max_size=8),
        publish_failures=st.lists(st.booleans(), max_size=12),
        restart_after_failure=st.booleans(),
    )
    async def test_routing_publishes_each_seq_once_in_increasing_order(
        self,
        seqs: list[int],
        batch_sizes: list[int],
        publish_failures: list[bool],
        restart_after_failure: bool,
    ) -> None:
        h = Harness(max_deliveries=1_000)
        await h.source.prepare()
        for seq in seqs:
            h.xadd("job-1", seq)
        h.xadd("job-2", 1)  # another job, possibly in the same batches
        failures = iter(publish_failures)
        sizes = itertools.cycle(batch_sizes)

        while batch := await h.read(count=next(sizes)):
            while True:
                h.broadcaster.available = not next(failures, False)
                result = await h.route(batch)
                if not result.unsettled:
                    break
                if restart_after_failure:
                    # The process dies; its successor re-reads its own pending entries first.
                    h.source = h.consumer_source(h.consumer)
                    h.route = h.route_for(h.source)
                    batch = await h.redeliver()
                else:
                    batch = result.unsettled

        published = h.published_seqs("job-1")
        assert published == sorted(set(published))
        assert published == await h.history_seqs("job-1")
        assert published[-1] == max(seqs)
        assert (await h.state("job-1") or {}).get("seq") == max(seqs)
        assert h.published_seqs("job-2") == [1]
        assert h.pending() == {}
