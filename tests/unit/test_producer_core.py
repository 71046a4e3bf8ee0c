"""The producer's rules without I/O: the read loop of a job's control messages, what a
publisher sends for a batch and what the replies mean, how a run of tokens is numbered and
refused, how deltas become batches, and when a failed batch is sent again. No client, no
clock: `now` is given."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eco_router.adapters.producer_calls import StageEventCalls
from eco_router.adapters.producer_core import (
    MAX_BATCH,
    TOKEN_WRITE_RETRY_S,
    PublisherCore,
    TokenBatching,
    TokenRetries,
)
from eco_router.application.errors import ReplicasBehind
from eco_router.domain.control import ControlKind, ControlMessage, ControlState, PendingControls
from eco_router.domain.control_reading import (
    WAIT_SLICE_S,
    ControlReading,
    Deliver,
    KnownCancels,
    WaitForMore,
)
from eco_router.domain.progress import InvalidProgressEvent, StageEvent
from eco_router.domain.token_entries import Coalescing
from eco_router.producer import AsyncStreamPublisher, StreamPublisher, producer_config

JOB = "job-1"


def message(number: int) -> ControlMessage:
    return ControlMessage(
        domain="chat",
        job_id=JOB,
        message_id=f"{number}-0",
        number=number,
        kind=ControlKind.INPUT,
        request_id=f"r{number}",
        body={"input": str(number)},
        state=ControlState.DELIVERED,
        deliveries=1,
    )


def page(*numbers: int, more: bool = False) -> PendingControls:
    last = f"{numbers[-1]}-0" if numbers else "0-0"
    return PendingControls(tuple(message(n) for n in numbers), last, more=more)


class TestAControlRead:
    def test_the_first_step_reads_from_the_logs_beginning(self) -> None:
        reading = ControlReading(timeout_s=5, now=0)

        assert reading.next_step(0) == Deliver("0-0")

    def test_a_full_page_is_followed_at_once_by_the_next_one(self) -> None:
        reading = ControlReading(timeout_s=0, now=0)
        reading.next_step(0)

        handed = reading.delivered(page(1, 2, more=True))

        assert [m.number for m in handed] == [1, 2]
        assert reading.next_step(100) == Deliver("2-0")

    def test_a_page_not_full_waits_after_its_last_id_for_what_is_left(self) -> None:
        reading = ControlReading(timeout_s=2.5, now=10)
        reading.next_step(10)
        reading.delivered(page(1))

        assert reading.next_step(11.75) == WaitForMore("1-0", 0.75)
        assert reading.next_step(12.5) == Deliver("1-0")

    def test_a_wait_is_cut_in_slices_so_the_jobs_end_is_read_between_them(self) -> None:
        reading = ControlReading(timeout_s=None, now=0)
        reading.next_step(0)
        reading.delivered(page())

        assert reading.next_step(1_000_000) == WaitForMore("0-0", WAIT_SLICE_S)

    def test_a_deadline_passed_reads_once_without_waiting(self) -> None:
        reading = ControlReading(timeout_s=0, now=0)
        assert reading.next_step(0) == Deliver("0-0")
        reading.delivered(page(3))

        assert reading.next_step(0) is None
        assert reading.next_step(0) is None

    def test_nothing_is_handed_once_the_job_has_ended(self) -> None:
        reading = ControlReading(timeout_s=None, now=0)
        reading.next_step(0)

        assert reading.delivered(PendingControls(ended=True)) == ()
        assert reading.next_step(0) is None

    @given(
        pages=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=8),
        timeout_s=st.floats(min_value=0, max_value=10),
    )
    def test_every_message_of_full_pages_is_handed_once_in_order_without_a_wait(
        self, pages: list[int], timeout_s: float
    ) -> None:
        reading = ControlReading(timeout_s=timeout_s, now=0)
        numbers = iter(range(1, 100))
        sent: list[int] = []
        handed: list[int] = []
        for index, size in enumerate(pages):
            step = reading.next_step(0)
            assert step == Deliver(f"{sent[-1]}-0" if sent else "0-0")
            batch = [next(numbers) for _ in range(size)] or [next(numbers)]
            sent += batch
            last = index == len(pages) - 1
            handed += [m.number for m in reading.delivered(page(*batch, more=not last))]

        assert handed == sent
        assert isinstance(reading.next_step(0), WaitForMore | None)


class TestKnownCancels:
    def test_a_cancel_read_is_known_without_reading_again(self) -> None:
        cancels = KnownCancels()

        assert cancels.read(JOB, False) is False
        assert not cancels.known(JOB)
        assert cancels.read(JOB, True) is True
        assert cancels.known(JOB)


CONFIG = producer_config(domain="chat", shards=4)


class TestWhatAPublisherSends:
    def test_a_batch_is_one_script_call_per_entry_in_order(self) -> None:
        core = PublisherCore(CONFIG)
        writing = core.token_writing(JOB, ["a", "b"], coalesce_ms=0)
        batch = writing.batch(["a", "b"])

        commands = core.pipelined("sha1", batch.entries, {})

        assert [words[:4] for words, _ in commands] == [
            ("EVALSHA", "sha1", 2, CONFIG.family.stream_for(JOB)),
            ("EVALSHA", "sha1", 2, CONFIG.family.stream_for(JOB)),
        ]
        contents = [words[words.index("content") + 1] for words, _ in commands]
        assert contents == ["a", "b"]
        assert core.entry_ids([b"1-0", "1-1"]) == ["1-0", "1-1"]

    def test_with_replicas_asked_the_batch_ends_with_wait_on_the_writing_node(self) -> None:
        core = PublisherCore(producer_config(domain="chat", wait_replicas=2, wait_timeout_ms=300))
        entries = core.token_writing(JOB, ["a"]).batch(["a"]).entries

        commands = core.pipelined("sha1", entries, {"target_nodes": "node"})

        assert commands[-1] == (("WAIT", 2, 300), {"target_nodes": "node"})
        assert core.entry_ids([b"1-0", 2]) == ["1-0"]
        with pytest.raises(ReplicasBehind, match="1 of 2 replicas"):
            core.entry_ids([b"1-0", 1])

    def test_a_stage_event_is_validated_before_anything_is_sent(self) -> None:
        with pytest.raises(InvalidProgressEvent, match="unknown status"):
            PublisherCore(CONFIG).stage_event(StageEvent(JOB, "answer", "running"))


class TestARunOfTokens:
    def test_its_entries_take_the_next_seqs_and_the_tally_counts_what_was_written(
        self,
    ) -> None:
        writing = PublisherCore(CONFIG).token_writing(JOB, [], first_seq=7)

        first = writing.batch(["ab", "c"])
        writing.written(first)
        second = writing.batch(["d"])
        writing.written(second)

        assert [e.fields["seq"] for e in [*first.entries, *second.entries]] == ["7", "8", "9"]
        published = writing.published()
        assert (published.entries, published.last_seq, published.characters) == (3, 9, 4)

    def test_entries_before_one_too_large_are_written_then_its_error_raised(self) -> None:
        small = producer_config(domain="chat", max_event_bytes=1024)
        writing = PublisherCore(small).token_writing(JOB, [])

        batch = writing.batch(["ok", "x" * 2048, "never"])

        assert [e.fields["content"] for e in batch.entries] == ["ok"]
        with pytest.raises(InvalidProgressEvent, match="too large"):
            writing.written(batch)
        assert writing.published().entries == 1

    def test_one_text_in_place_of_an_iterable_is_refused_before_anything(self) -> None:
        with pytest.raises(InvalidProgressEvent, match="not one text"):
            PublisherCore(CONFIG).token_writing(JOB, "a whole answer")


class TestSendingABatchAgain:
    def test_a_transient_failure_is_sent_again_with_a_growing_delay(self) -> None:
        retries = TokenRetries(now=0)
        error = ConnectionError("lost")

        delays = [retries.delay_after(error, transient=True, now=0) for _ in range(3)]

        assert 0 < delays[0] <= delays[1] <= delays[2]

    def test_a_failure_that_will_not_pass_is_raised_at_once(self) -> None:
        error = ValueError("bad")

        with pytest.raises(ValueError, match="bad"):
            TokenRetries(now=0).delay_after(error, transient=False, now=0)

    def test_past_the_retry_window_the_error_is_raised(self) -> None:
        error = ConnectionError("lost")

        with pytest.raises(ConnectionError):
            TokenRetries(now=0).delay_after(error, transient=True, now=TOKEN_WRITE_RETRY_S)


class TestThePublishCall:
    def test_publish_stage_event_publishes_the_value_its_arguments_make(self) -> None:
        published: list[StageEvent] = []

        class Recording(StageEventCalls[str]):
            def publish(self, event: StageEvent) -> str:
                published.append(event)
                return "1-0"

        entry_id = Recording().publish_stage_event(
            JOB, "answer", "completed", result={"a": 1}, progress=50, seq=41
        )

        assert entry_id == "1-0"
        assert published == [StageEvent(JOB, "answer", "completed", {"a": 1}, 50, 41)]

    def test_the_value_is_validated_against_the_plan(self) -> None:
        plan = producer_config(stages=("vision",)).plan

        assert StageEvent(JOB, "vision", "completed").validated(plan).seq == 11
        with pytest.raises(InvalidProgressEvent, match="progress"):
            StageEvent(JOB, "vision", "completed", progress=101).validated(plan)


RULE = Coalescing(window_s=0.05, max_cost=1000)


class TestTokenBatching:
    def test_deltas_within_the_window_share_an_entry_written_when_it_is_due(self) -> None:
        batching = TokenBatching(RULE)
        batching.arrived("a", 0.0)
        batching.arrived("b", 0.01)

        assert batching.batches() == []
        assert batching.due_in(0.02) == pytest.approx(0.03)
        batching.tick(0.05)
        assert batching.batches() == [["ab"]]
        assert batching.due_in(0.05) is None

    def test_a_delta_after_the_window_closes_the_entry_before_it(self) -> None:
        batching = TokenBatching(RULE)
        batching.arrived("a", 0.0)
        batching.arrived("b", 0.2)

        assert batching.batches() == [["a"]]
        batching.ended()
        assert batching.batches() == [["b"]]
        assert batching.over

    def test_chunks_without_text_are_skipped_and_openai_chunks_read(self) -> None:
        batching = TokenBatching(Coalescing(0, 1000))
        batching.arrived({"choices": [{"delta": {"role": "assistant"}}]}, 0)
        batching.arrived({"choices": [{"delta": {"content": "hi"}}]}, 0)
        batching.arrived({"choices": []}, 0)
        batching.ended()

        assert batching.batches() == [["hi"]]

    def test_what_came_before_an_item_that_is_not_a_delta_is_written_then_refused(
        self,
    ) -> None:
        batching = TokenBatching(RULE)
        batching.arrived("a", 0)
        batching.arrived(42, 0)
        batching.arrived("never", 0)

        assert batching.over
        assert batching.batches() == [["a"]]
        with pytest.raises(InvalidProgressEvent, match="not int"):
            batching.raise_failure()

    def test_a_source_failure_is_raised_after_what_it_gave(self) -> None:
        batching = TokenBatching(RULE)
        batching.arrived("a", 0)
        batching.failed(RuntimeError("model gone"))
        batching.ended()

        assert batching.batches() == [["a"]]
        with pytest.raises(RuntimeError, match="model gone"):
            batching.raise_failure()

    def test_batches_hold_at_most_max_batch_entries_and_a_whole_source_waits_for_one(
        self,
    ) -> None:
        batching = TokenBatching(Coalescing(0, 1000))
        for n in range(MAX_BATCH):
            batching.arrived(str(n), 0)
            assert batching.full_batches() == []
        batching.arrived("last", 0)

        assert [len(b) for b in batching.full_batches()] == [MAX_BATCH]
        batching.ended()
        assert batching.batches() == [["last"]]


class TestTheTwoShells:
    def test_the_blocking_and_asyncio_publishers_offer_the_same_calls(self) -> None:
        def calls(shell: type) -> dict[str, list[tuple[str, object, object]]]:
            return {
                name: [
                    (p.name, p.kind, p.default)
                    for p in inspect.signature(getattr(shell, name)).parameters.values()
                ]
                for name in dir(shell)
                if not name.startswith("_") and callable(getattr(shell, name))
            }

        blocking, asyncio_ = calls(StreamPublisher), calls(AsyncStreamPublisher)

        assert "publish_stage_event" in blocking
        assert blocking == asyncio_


class TestAPipelineWithoutItsScript:
    def test_it_is_sent_again_at_once_the_script_loaded_first_once(self) -> None:
        retries = TokenRetries(now=0)
        missing = Exception("NOSCRIPT")

        assert retries.script_to_load() is False
        assert retries.delay_after(missing, transient=False, now=0, no_script=True) == 0.0
        assert retries.script_to_load() is True
        assert retries.script_to_load() is False

    def test_a_second_refusal_after_loading_is_raised(self) -> None:
        retries = TokenRetries(now=0)
        missing = Exception("NOSCRIPT")
        retries.delay_after(missing, transient=False, now=0, no_script=True)

        with pytest.raises(Exception, match="NOSCRIPT"):
            retries.delay_after(missing, transient=False, now=0, no_script=True)
