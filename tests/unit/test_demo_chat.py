"""Demo chat jobs on the in-memory publisher: the reference chat worker's events around an
answer streamed as tokens, failures halfway, early stops, and starting one from the page."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.control_store import InMemoryControlStore
from eco_router.adapters.memory.publisher import InMemoryStreamPublisher
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.control_inbox import ControlInbox
from eco_router.application.demo_jobs import (
    CHAT_ANSWERS,
    RunDemoJobs,
    StartDemoJob,
    answer_tokens,
)
from eco_router.domain.control import ControlKind, control_request
from eco_router.domain.streams import StreamFamily
from eco_router.producer import ProducerConfig
from tests.contracts.control_store import record

SCAN = StreamFamily("scan:events", 2)
STAGES = ("vision", "rule", "answer", "reward")
FAST = 1_000_000.0  # events (and tokens) per second: pacing never holds a test back


def make_run(**overrides: Any) -> tuple[RunDemoJobs, InMemoryStreams]:
    """A run whose chat jobs go through the same in-memory publisher as its scan jobs."""
    streams = InMemoryStreams(ManualClock())
    publisher = InMemoryStreamPublisher(streams, ProducerConfig(family=SCAN))
    values: dict[str, Any] = {
        "publisher": publisher,
        "chat_publisher": publisher,
        "stages": STAGES,
        "rate": FAST,
        "tokens_per_s": FAST,
        "retry_every": 10**9,
        "seed": 1,
    }
    return RunDemoJobs(**(values | overrides)), streams


def job_entries(streams: InMemoryStreams) -> dict[str, list[dict[str, str]]]:
    """Every job's entries, fields decoded, in stream order."""
    jobs: dict[str, list[dict[str, str]]] = {}
    for stream in SCAN.streams:
        for _, fields in streams.entries(stream):
            entry = {k.decode(): v.decode() for k, v in fields.items()}
            jobs.setdefault(entry["job_id"], []).append(entry)
    return jobs


def shape(entries: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    """(stage, status, seq) of every stage event; tokens as one ("token", ...) run."""
    shapes: list[tuple[str, str, str]] = []
    for entry in entries:
        if entry["stage"] == "token" and shapes and shapes[-1][0] == "token":
            continue
        seq = "1001.." if entry["stage"] == "token" else entry["seq"]
        shapes.append((entry["stage"], entry["status"], seq))
    return shapes


def answer(entries: list[dict[str, str]]) -> str:
    return "".join(e["content"] for e in entries if e["stage"] == "token")


class TestAChatJob:
    async def test_it_streams_its_answer_between_the_reference_workers_stage_events(
        self,
    ) -> None:
        run, streams = make_run()

        tally = await run.run_one("chat-1", asyncio.Event(), chat=True)

        entries = job_entries(streams)["chat-1"]
        assert shape(entries) == [
            ("queued", "queued", "0"),
            ("intent", "started", "10"),
            ("intent", "completed", "11"),
            ("answer", "started", "160"),
            ("token", "streaming", "1001.."),
            ("answer", "completed", "161"),
            ("done", "done", "181"),
        ]
        assert answer(entries) in CHAT_ANSWERS
        assert (tally.jobs_finished, tally.events) == (1, 6)

    async def test_its_tokens_are_numbered_from_1001_on_the_answer_node(self) -> None:
        run, streams = make_run()

        tally = await run.run_one("chat-1", asyncio.Event(), chat=True)

        tokens = [e for e in job_entries(streams)["chat-1"] if e["stage"] == "token"]
        assert [int(e["seq"]) for e in tokens] == list(range(1001, 1001 + len(tokens)))
        assert {e["node"] for e in tokens} == {"answer"}
        assert tally.tokens == len(tokens)

    async def test_done_tells_the_answers_length_in_characters(self) -> None:
        run, streams = make_run()

        await run.run_one("chat-1", asyncio.Event(), chat=True)

        entries = job_entries(streams)["chat-1"]
        result = orjson.loads(entries[-1]["result"])
        assert result == {"answer_chars": len(answer(entries))}

    async def test_a_paced_answer_is_written_as_it_comes_in_many_entries(self) -> None:
        # 200 tokens/s against the 50 ms window: about ten deltas per entry.
        run, streams = make_run(tokens_per_s=200.0)

        await run.run_one("chat-1", asyncio.Event(), chat=True)

        text = answer(job_entries(streams)["chat-1"])
        tokens = [e for e in job_entries(streams)["chat-1"] if e["stage"] == "token"]
        assert len(tokens) > len(answer_tokens(text)) // 20

    async def test_a_failing_one_stops_halfway_through_its_answer(self) -> None:
        run, streams = make_run()

        tally = await run.run_one("chat-1", asyncio.Event(), chat=True, fail_at=0)

        entries = job_entries(streams)["chat-1"]
        assert shape(entries)[-2:] == [
            ("token", "streaming", "1001.."),
            ("answer", "failed", "162"),
        ]
        assert orjson.loads(entries[-1]["result"]) == {"error": "the model stopped mid-answer"}
        full = next(a for a in CHAT_ANSWERS if a.startswith(answer(entries)))
        assert len(answer(entries)) < len(full)
        assert tally.jobs_failed == 1

    async def test_a_stop_ends_the_answer_between_two_tokens_and_writes_nothing_after(
        self,
    ) -> None:
        run, streams = make_run(tokens_per_s=100.0)
        stop = asyncio.Event()

        async def stop_after_some_tokens() -> None:
            for _ in range(1000):
                entries = job_entries(streams).get("chat-1", [])
                if sum(e["stage"] == "token" for e in entries) >= 3:
                    break
                await asyncio.sleep(0.01)
            stop.set()

        tally, _ = await asyncio.gather(
            run.run_one("chat-1", stop, chat=True), stop_after_some_tokens()
        )

        entries = job_entries(streams)["chat-1"]
        assert entries[-1]["stage"] == "token"
        assert answer(entries) not in CHAT_ANSWERS
        assert tally.jobs_finished == tally.jobs_failed == 0


class TestRunningManyJobs:
    async def test_every_second_job_is_a_chat_job_when_a_chat_publisher_is_given(self) -> None:
        run, streams = make_run(failure_every=10**9)

        tally = await run(6, asyncio.Event())

        jobs = job_entries(streams)
        chats = [j for j, entries in jobs.items() if any(e["stage"] == "token" for e in entries)]
        assert (len(jobs), len(chats)) == (6, 3)
        assert tally.jobs_finished == 6
        assert all(entries[-1]["stage"] == "done" for entries in jobs.values())

    async def test_without_a_chat_publisher_there_are_only_pipelines(self) -> None:
        run, streams = make_run(chat_publisher=None)

        await run(4, asyncio.Event())

        entries = [e for job in job_entries(streams).values() for e in job]
        assert len(job_entries(streams)) == 4
        assert all(e["stage"] != "token" for e in entries)


class TestStartingOneFromThePage:
    async def test_a_chat_job_starts_in_the_background_and_finishes(self) -> None:
        run, streams = make_run()
        start = StartDemoJob(run=run, job_prefix="page")
        try:
            job_id = await start(chat=True)
            for _ in range(500):
                entries = job_entries(streams).get(job_id, [])
                if entries and entries[-1]["stage"] == "done":
                    break
                await asyncio.sleep(0.01)
        finally:
            await start.aclose()

        assert answer(job_entries(streams)[job_id]) in CHAT_ANSWERS

    async def test_a_chat_job_without_a_chat_publisher_is_refused_at_once(self) -> None:
        run, _ = make_run(chat_publisher=None)
        start = StartDemoJob(run=run)

        with pytest.raises(ValueError, match="chat publisher"):
            await start(chat=True)
        await start.aclose()


def test_the_answers_are_long_enough_to_watch_and_to_drop_the_connection_in() -> None:
    for text in CHAT_ANSWERS:
        deltas = answer_tokens(text)
        assert "".join(deltas) == text
        assert 150 <= len(deltas) <= 300
        assert any("\uac00" <= c <= "\ud7a3" for c in text)  # Hangul
        assert any(ord(c) > 0xFFFF for c in text)  # emoji beyond the BMP
        assert any(c.isascii() and c.isalpha() for c in text)


class TestAChatJobStartedFromThePage:
    """Given the chat domain's inbox, a chat job run alone stops when cancelled and, started
    with `ask`, asks its user which answer to give first."""

    def make(self, **overrides: Any) -> tuple[RunDemoJobs, InMemoryStreams, InMemoryControlStore]:
        clock = ManualClock()
        streams = InMemoryStreams(clock)
        states = InMemoryStateStore(
            clock=clock, streams=streams, group="g", state_ttl_s=60, markers_ttl_s=60,
            history_size=10,
        )  # fmt: skip
        store = InMemoryControlStore(
            streams=streams, states=states, families=[SCAN], state_ttl_s=60, clock=clock
        )
        publisher = InMemoryStreamPublisher(streams, ProducerConfig(family=SCAN))
        values: dict[str, Any] = {
            "publisher": publisher,
            "chat_publisher": publisher,
            "stages": STAGES,
            "rate": FAST,
            "tokens_per_s": FAST,
            "retry_every": 10**9,
            "seed": 1,
            "controls": ControlInbox(store, "scan"),
        }
        return RunDemoJobs(**(values | overrides)), streams, store

    async def until_entry(self, streams: InMemoryStreams, stage: str, count: int = 1) -> None:
        for _ in range(1000):
            entries = job_entries(streams).get("chat-1", [])
            if sum(e["stage"] == stage for e in entries) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"no {stage} entry")

    async def test_it_asks_and_answers_as_its_user_chose(self) -> None:
        run, streams, store = self.make()
        job = asyncio.create_task(run.run_one("chat-1", asyncio.Event(), chat=True, ask=True))
        await self.until_entry(streams, "needs_input")

        await record(store, control_request("scan", "chat-1", ControlKind.INPUT,
                                           b'{"input": "the weather"}', "r1"))  # fmt: skip
        tally = await job

        entries = job_entries(streams)["chat-1"]
        assert shape(entries)[3] == ("needs_input", "waiting", "190")
        question = orjson.loads(entries[3]["result"])
        assert question["options"] == ["a greeting", "the weather"]
        assert answer(entries) == CHAT_ANSWERS[1]
        assert shape(entries)[-1] == ("done", "done", "181")
        assert tally.jobs_finished == 1
        assert [m.state.value for m in (await store.messages("scan", "chat-1")).messages] == [
            "acknowledged"
        ]

    async def test_a_cancel_stops_its_typing_and_ends_it_cancelled(self) -> None:
        run, streams, store = self.make(tokens_per_s=100.0)
        job = asyncio.create_task(run.run_one("chat-1", asyncio.Event(), chat=True))
        await self.until_entry(streams, "token", 3)

        await record(store, control_request("scan", "chat-1", ControlKind.CANCEL, b"", "c1"))
        await job

        entries = job_entries(streams)["chat-1"]
        assert shape(entries)[-1] == ("done", "cancelled", "181")
        assert answer(entries) not in CHAT_ANSWERS
        assert orjson.loads(entries[-1]["result"]) == {"answer_chars": len(answer(entries))}
        assert [m.state.value for m in (await store.messages("scan", "chat-1")).messages] == [
            "acknowledged"
        ]

    async def test_a_cancel_in_place_of_the_reply_ends_it_before_any_token(self) -> None:
        run, streams, store = self.make()
        job = asyncio.create_task(run.run_one("chat-1", asyncio.Event(), chat=True, ask=True))
        await self.until_entry(streams, "needs_input")

        await record(store, control_request("scan", "chat-1", ControlKind.CANCEL, b"", "c1"))
        await job

        entries = job_entries(streams)["chat-1"]
        assert [s for s, _, _ in shape(entries)] == [
            "queued", "intent", "intent", "needs_input", "cancel_requested", "done"
        ]  # fmt: skip
        assert entries[-1]["status"] == "cancelled"

    async def test_jobs_run_together_are_never_asked(self) -> None:
        run, streams, _ = self.make(failure_every=10**9)

        await run(2, asyncio.Event())

        stages = [e["stage"] for entries in job_entries(streams).values() for e in entries]
        assert "token" in stages
        assert "needs_input" not in stages
