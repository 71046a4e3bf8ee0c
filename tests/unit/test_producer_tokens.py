"""The token API on the in-memory publisher: the entries written, coalescing windows,
OpenAI-style chunks, idempotency per (job, attempt, seq), and refusals before any write."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.publisher import InMemoryStreamPublisher
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.adapters.token_batches import MAX_BATCH, coalesced_sync
from eco_router.domain.event import JobEvent
from eco_router.domain.event_size import EventSizeLimits
from eco_router.domain.parsing import parse_entry
from eco_router.domain.streams import StreamFamily
from eco_router.domain.token_entries import Coalescing
from eco_router.producer import InvalidProgressEvent, ProducerConfig, TokensPublished

CHAT = StreamFamily("chat:events", 4)
JOB = "job-7"
# Long enough that a test's own scheduling never closes an entry early.
WIDE_MS = 10_000
ANSWER = ["안녕하세요", ", ", "world", "! ", "🐈‍⬛", " ok"]


def make_publisher(**config: Any) -> tuple[InMemoryStreamPublisher, InMemoryStreams]:
    streams = InMemoryStreams(ManualClock())
    return InMemoryStreamPublisher(streams, ProducerConfig(family=CHAT, **config)), streams


def md5_stream(job_id: str) -> str:
    """The job's shard by the documented rule, computed apart from the code under test."""
    digest = hashlib.md5(job_id.encode()).digest()
    return f"chat:events:{int.from_bytes(digest[:8], 'big') % 4}"


def written(streams: InMemoryStreams, job_id: str = JOB) -> list[dict[str, str]]:
    """The job's entries, fields decoded, in stream order."""
    return [
        {name.decode(): value.decode() for name, value in fields.items()}
        for _, fields in streams.entries(md5_stream(job_id))
        if fields[b"job_id"] == job_id.encode()
    ]


def contents(streams: InMemoryStreams, job_id: str = JOB) -> list[str]:
    return [entry["content"] for entry in written(streams, job_id)]


async def paced(*steps: tuple[float, Any]) -> AsyncIterator[Any]:
    """Yields each item after sleeping its delay, as a model's stream does."""
    for delay, item in steps:
        await asyncio.sleep(delay)
        yield item


def chunk(content: str | None, *, finish: str | None = None) -> SimpleNamespace:
    """An OpenAI `ChatCompletionChunk` as the SDK gives it: objects all the way down."""
    delta = SimpleNamespace(content=content, role=None)
    return SimpleNamespace(choices=[SimpleNamespace(delta=delta, finish_reason=finish, index=0)])


class TestTheEntriesWritten:
    async def test_a_token_entry_has_the_reference_fields_in_order(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ["hello"], node="answer")

        [entry] = written(streams)
        assert list(entry) == ["job_id", "stage", "status", "seq", "ts", "content", "node"]
        assert {k: v for k, v in entry.items() if k != "ts"} == {
            "job_id": JOB,
            "stage": "token",
            "status": "streaming",
            "seq": "1001",
            "content": "hello",
            "node": "answer",
        }
        assert re.fullmatch(r"[0-9]+\.[0-9]{3}", entry["ts"])

    async def test_no_node_and_attempt_0_are_left_out(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ["hello"])

        assert set(written(streams)[0]) == {"job_id", "stage", "status", "seq", "ts", "content"}

    async def test_a_later_attempt_is_written_as_a_decimal(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ["hello"], attempt=2)

        assert written(streams)[0]["attempt"] == "2"

    async def test_entries_land_on_the_md5_shard_of_the_job_and_nowhere_else(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ["a", "b"], coalesce_ms=0)

        assert contents(streams) == ["a", "b"]
        others = [s for s in CHAT.streams if s != md5_stream(JOB)]
        assert all(streams.entries(stream) == [] for stream in others)

    async def test_seqs_count_up_from_the_first_and_the_result_tells_what_was_written(
        self,
    ) -> None:
        publisher, streams = make_publisher()

        published = await publisher.publish_tokens(JOB, ANSWER, coalesce_ms=0)

        assert [int(e["seq"]) for e in written(streams)] == list(range(1001, 1007))
        text = "".join(ANSWER)
        assert published == TokensPublished(
            entries=6,
            first_seq=1001,
            last_seq=1006,
            characters=len(text),
            text_bytes=len(text.encode()),
        )

    async def test_a_second_run_of_the_attempt_continues_from_next_seq(self) -> None:
        publisher, streams = make_publisher()

        first = await publisher.publish_tokens(JOB, ["a", "b"], coalesce_ms=0)
        await publisher.publish_tokens(JOB, ["c"], node="eval", first_seq=first.next_seq)

        assert [(e["seq"], e["content"]) for e in written(streams)] == [
            ("1001", "a"),
            ("1002", "b"),
            ("1003", "c"),
        ]

    async def test_a_run_with_no_text_writes_nothing(self) -> None:
        publisher, streams = make_publisher()

        published = await publisher.publish_tokens(JOB, ["", chunk(None)])

        assert written(streams) == []
        assert (published.entries, published.last_seq, published.next_seq) == (0, None, 1001)

    async def test_the_callers_trace_context_is_on_every_entry(self) -> None:
        publisher, streams = make_publisher()
        tracer = TracerProvider().get_tracer("worker")

        with tracer.start_as_current_span("answer"):
            await publisher.publish_tokens(JOB, ["a", "b"], coalesce_ms=0)

        parents = {entry.get("traceparent") for entry in written(streams)}
        assert len(parents) == 1
        assert None not in parents

    async def test_every_entry_is_one_the_router_routes_as_a_token(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ANSWER, node="answer", attempt=1, coalesce_ms=0)

        for entry_id, fields in streams.entries(md5_stream(JOB)):
            routed = parse_entry(domain="chat", stream="s", entry_id=entry_id, fields=fields)
            assert isinstance(routed, JobEvent), routed
            assert (routed.is_token, routed.attempt, routed.node) == (True, 1, "answer")
        assert "".join(contents(streams)) == "".join(ANSWER)


class TestCoalescing:
    async def test_deltas_ready_together_share_one_entry(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ANSWER, coalesce_ms=WIDE_MS)

        assert contents(streams) == ["".join(ANSWER)]

    async def test_a_zero_window_gives_each_delta_its_own_entry(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ANSWER, coalesce_ms=0)

        assert contents(streams) == ANSWER

    async def test_a_delta_after_the_window_starts_a_new_entry(self) -> None:
        publisher, streams = make_publisher()
        source = paced((0, "a"), (0, "b"), (0.4, "c"), (0, "d"))

        await publisher.publish_tokens(JOB, source, coalesce_ms=100)

        assert contents(streams) == ["ab", "cd"]

    async def test_a_pending_entry_is_written_when_its_window_ends_while_the_source_is_quiet(
        self,
    ) -> None:
        publisher, streams = make_publisher()
        released = asyncio.Event()

        async def source() -> AsyncIterator[str]:
            yield "first"
            await released.wait()  # the model thinks; the text so far must not wait with it
            yield "second"

        run = asyncio.create_task(publisher.publish_tokens(JOB, source(), coalesce_ms=20))
        try:
            for _ in range(1000):  # up to 5 s: far beyond the 20 ms window
                if contents(streams):
                    break
                await asyncio.sleep(0.005)
            assert contents(streams) == ["first"]
        finally:
            released.set()
        await run

        assert contents(streams) == ["first", "second"]

    async def test_merged_entries_stay_within_the_routers_size_limit_and_split_no_delta(
        self,
    ) -> None:
        limits = EventSizeLimits(max_event_bytes=1024, max_result_bytes=1024)
        publisher, streams = make_publisher(size_limits=limits)
        deltas = [f'<{n:03d}:토큰\n"q">' for n in range(200)]

        await publisher.publish_tokens(JOB, deltas, node="answer", coalesce_ms=WIDE_MS)

        entries = contents(streams)
        assert 1 < len(entries) < len(deltas)
        assert "".join(entries) == "".join(deltas)
        for text in entries:
            assert re.fullmatch(r'(<[0-9]{3}:토큰\n"q">)+', text), "a delta was split"
        for entry_id, fields in streams.entries(md5_stream(JOB)):
            routed = parse_entry(domain="chat", stream="s", entry_id=entry_id, fields=fields)
            assert isinstance(routed, JobEvent)
            # The router's stamp (event ids, restart) still fits under the limit.
            assert len(orjson.dumps(routed.as_payload())) + 80 <= 1024

    async def test_entries_ready_together_are_written_in_one_round_trip(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, [f"t{n} " for n in range(100)], coalesce_ms=0)

        assert len(contents(streams)) == 100
        assert publisher.round_trips == 1

    async def test_a_long_list_goes_in_batches_of_bounded_size(self) -> None:
        publisher, streams = make_publisher()
        count = MAX_BATCH * 2 + 10

        await publisher.publish_tokens(JOB, [f"t{n} " for n in range(count)], coalesce_ms=0)

        assert len(contents(streams)) == count
        assert publisher.round_trips == 3

    def test_a_synchronous_iterator_has_each_entry_written_once_it_is_closed(self) -> None:
        # Its next delta may be a long way off: what is closed must not wait for it.
        def generator() -> Iterator[str]:
            yield from ["a", "b", "c"]

        rule = Coalescing(window_s=0.0, max_cost=100)

        assert list(coalesced_sync(generator(), rule)) == [["a"], ["b"], ["c"]]
        assert list(coalesced_sync(["a", "b", "c"], rule)) == [["a", "b", "c"]]


class TestOpenAIStyleChunks:
    async def test_chunk_objects_give_their_delta_content_and_none_is_skipped(self) -> None:
        publisher, streams = make_publisher()
        stream = [
            SimpleNamespace(choices=[SimpleNamespace(delta=SimpleNamespace(content=None))]),
            chunk("안녕"),
            chunk(" there 👋"),
            chunk(None, finish="stop"),
            SimpleNamespace(choices=[], usage=SimpleNamespace(total_tokens=9)),
        ]

        published = await publisher.publish_tokens(JOB, stream, coalesce_ms=0)

        assert contents(streams) == ["안녕", " there 👋"]
        assert published.entries == 2

    async def test_decoded_json_chunks_and_plain_strings_may_be_mixed(self) -> None:
        publisher, streams = make_publisher()
        stream = [
            {"choices": [{"delta": {"role": "assistant"}}]},
            {"choices": [{"delta": {"content": "Hi"}}]},
            " and ",
            chunk("bye"),
        ]

        await publisher.publish_tokens(JOB, stream, coalesce_ms=0)

        assert contents(streams) == ["Hi", " and ", "bye"]

    async def test_an_async_stream_of_chunks_is_read_as_it_comes(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(
            JOB, paced((0, chunk("a")), (0.01, chunk("b"))), coalesce_ms=WIDE_MS
        )

        assert contents(streams) == ["ab"]

    @pytest.mark.parametrize(
        "item",
        [42, b"bytes", SimpleNamespace(text="x"), {"choices": [{"delta": {"content": 5}}]}],
        ids=["int", "bytes", "no-choices", "content-not-text"],
    )
    async def test_an_item_that_is_no_delta_is_refused_after_what_came_before(
        self, item: Any
    ) -> None:
        publisher, streams = make_publisher()

        with pytest.raises(InvalidProgressEvent, match=r"OpenAI-style chunk|must be a str"):
            await publisher.publish_tokens(JOB, ["before", item, "after"], coalesce_ms=0)

        assert contents(streams) == ["before"]


class TestIdempotency:
    async def test_a_repeated_run_of_the_same_attempt_writes_no_second_entry(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ANSWER, coalesce_ms=0)
        again = await publisher.publish_tokens(JOB, ANSWER, coalesce_ms=0)

        assert contents(streams) == ANSWER
        assert again.last_seq == 1006

    async def test_a_repeated_single_token_returns_the_first_entrys_id(self) -> None:
        publisher, streams = make_publisher()

        first = await publisher.publish_token(JOB, "hello", seq=1001, node="answer")
        again = await publisher.publish_token(JOB, "hello", seq=1001, node="answer")

        assert again == first
        assert contents(streams) == ["hello"]

    async def test_the_same_seq_in_another_attempt_is_another_entry(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_tokens(JOB, ["old"], coalesce_ms=0)
        await publisher.publish_tokens(JOB, ["new"], coalesce_ms=0, attempt=1)

        assert [(e["seq"], e.get("attempt"), e["content"]) for e in written(streams)] == [
            ("1001", None, "old"),
            ("1001", "1", "new"),
        ]

    async def test_the_same_seq_of_another_job_is_another_entry(self) -> None:
        publisher, streams = make_publisher()

        await publisher.publish_token("job-a", "x", seq=1001)
        await publisher.publish_token("job-b", "x", seq=1001)

        assert contents(streams, "job-a") == ["x"]
        assert contents(streams, "job-b") == ["x"]

    def test_a_tokens_marker_is_hash_tagged_to_its_stream_and_names_attempt_and_seq(
        self,
    ) -> None:
        entry = ProducerConfig(family=CHAT).token(JOB, "x", seq=1004, attempt=2)
        assert entry.idempotency_key == f"{{{md5_stream(JOB)}}}:once:5:job-7:token:2:1004"


class TestRefusals:
    @pytest.mark.parametrize(
        "overrides",
        [
            {"job_id": "job 7"},
            {"node": "a:b"},
            {"attempt": -1},
            {"attempt": True},
            {"coalesce_ms": -5},
            {"first_seq": -1},
        ],
        ids=str,
    )
    async def test_bad_settings_are_refused_before_any_delta_is_read(
        self, overrides: dict[str, Any]
    ) -> None:
        publisher, streams = make_publisher()
        read: list[str] = []

        async def source() -> AsyncIterator[str]:
            read.append("read")
            yield "x"

        values: dict[str, Any] = {"job_id": JOB} | overrides
        with pytest.raises(InvalidProgressEvent):
            await publisher.publish_tokens(values.pop("job_id"), source(), **values)

        assert read == []
        assert written(streams) == []

    async def test_one_text_instead_of_an_iterable_of_deltas_is_refused(self) -> None:
        publisher, _ = make_publisher()

        with pytest.raises(InvalidProgressEvent, match="publish_token"):
            await publisher.publish_tokens(JOB, "hello")

    async def test_a_single_token_with_bad_settings_is_refused(self) -> None:
        publisher, streams = make_publisher()

        with pytest.raises(InvalidProgressEvent, match="node"):
            await publisher.publish_token(JOB, "x", seq=1001, node="")
        with pytest.raises(InvalidProgressEvent, match="seq"):
            await publisher.publish_token(JOB, "x", seq=-1)

        assert written(streams) == []

    async def test_a_stage_event_saying_token_or_streaming_is_refused(self) -> None:
        publisher, streams = make_publisher()

        with pytest.raises(InvalidProgressEvent, match="publish_tokens"):
            await publisher.publish_stage_event(JOB, "token", "started", seq=1001)
        with pytest.raises(InvalidProgressEvent, match="publish_tokens"):
            await publisher.publish_stage_event(JOB, "answer", "streaming", seq=1001)

        assert written(streams) == []

    async def test_a_delta_too_large_for_an_entry_is_refused_after_what_came_before(
        self,
    ) -> None:
        limits = EventSizeLimits(max_event_bytes=1024, max_result_bytes=1024)
        publisher, streams = make_publisher(size_limits=limits)

        with pytest.raises(InvalidProgressEvent, match="too large"):
            await publisher.publish_tokens(JOB, ["ok", "x" * 2000, "never"], coalesce_ms=0)

        assert contents(streams) == ["ok"]

    async def test_a_failing_source_has_what_came_before_written_then_its_error_raised(
        self,
    ) -> None:
        publisher, streams = make_publisher()

        async def source() -> AsyncIterator[str]:
            yield "partial "
            yield "answer"
            raise ConnectionResetError("the model's stream broke")

        with pytest.raises(ConnectionResetError, match="model's stream"):
            await publisher.publish_tokens(JOB, source(), coalesce_ms=WIDE_MS)

        assert contents(streams) == ["partial answer"]

    async def test_a_cancelled_run_stops_reading_its_source(self) -> None:
        publisher, _ = make_publisher()
        closed = asyncio.Event()

        async def endless() -> AsyncIterator[str]:
            try:
                while True:
                    yield "x"
                    await asyncio.sleep(0.001)
            finally:
                closed.set()

        run = asyncio.create_task(publisher.publish_tokens(JOB, endless(), coalesce_ms=5))
        await asyncio.sleep(0.05)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

        async with asyncio.timeout(2):
            await closed.wait()
