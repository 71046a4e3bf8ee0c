"""An LLM's answer, token by token, from the worker's entries to the viewer's frames: the
router on its in-memory adapters and the SSE use case, as the reference chat worker writes
the entries (stage seqs below 1000, tokens from 1001) and its frontend rebuilds the text."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from eco_router.application.errors import BroadcastFailed
from eco_router.application.port_values import EncodedEvent
from eco_router.domain.verdict import Verdict
from tests.unit.test_stream_job_events import Gateway, Viewer, eventually

ANSWER = ["안녕", "하세요", "! ", "👩‍", "💻 ", "Plastic ", "goes ", "in ", "the ", "bin."]


@dataclass(frozen=True)
class Frame:
    """One SSE frame as the browser's EventSource hands it over."""

    id: int | None
    event: str
    data: Any


def frames_of(chunks: Sequence[bytes]) -> list[Frame]:
    frames = []
    for chunk in chunks:
        for raw in chunk.removesuffix(b"\n\n").split(b"\n\n"):
            if raw.startswith(b":"):
                continue
            fields = dict(line.split(": ", 1) for line in raw.decode().split("\n"))
            frame_id = int(fields["id"]) if "id" in fields else None
            frames.append(Frame(frame_id, fields["event"], orjson.loads(fields["data"])))
    return frames


async def ended(viewer: Viewer) -> list[Frame]:
    """The frames of a stream that must end on its own."""
    await viewer.ended()
    return frames_of(viewer.frames)


async def seen(viewer: Viewer, count: int) -> list[Frame]:
    """The frames once at least `count` have come (keepalives aside)."""
    await eventually(lambda: len(frames_of(viewer.frames)) >= count)
    return frames_of(viewer.frames)


def text_seen(frames: Sequence[Frame]) -> str:
    """The text as the reference frontend holds it: `token` appends, `token_recovery`
    replaces."""
    text = ""
    for frame in frames:
        if frame.event == "token":
            text += frame.data["content"]
        elif frame.event == "token_recovery":
            text = frame.data["accumulated"]
    return text


def last_event_id(frames: Sequence[Frame]) -> int | None:
    """What the browser's EventSource sends back as Last-Event-ID."""
    ids = [f.id for f in frames if f.id is not None]
    return ids[-1] if ids else None


class Chat:
    """A chat job's worker writing the reference worker's entries, routed at once."""

    def __init__(self, gateway: Gateway, job_id: str = "job-1") -> None:
        self.gw = gateway
        self.job_id = job_id
        self.next_token_seq = 1001

    async def stage(self, seq: int, stage: str, status: str, **fields: Any) -> None:
        await self.gw.produce(self.job_id, seq, stage=stage, status=status, **fields)

    async def tokens(self, deltas: Sequence[str], *, attempt: int | None = None) -> None:
        for delta in deltas:
            fields: dict[str, Any] = {"stage": "token", "status": "streaming", "content": delta}
            fields |= {"node": "answer"} if attempt is None else {"attempt": attempt}
            self.gw.h.xadd(self.job_id, self.next_token_seq, **fields)
            self.next_token_seq += 1
        await self.gw.h.route(await self.gw.h.read())

    async def answer(self, deltas: Sequence[str] = ANSWER) -> None:
        await self.stage(0, "queued", "started")
        await self.stage(160, "answer", "started")
        await self.tokens(deltas)
        await self.stage(161, "answer", "completed")
        await self.stage(181, "done", "completed", result='{"ok": true}')


@pytest.fixture
async def gw() -> Gateway:
    gateway = Gateway()
    await gateway.h.source.prepare()
    return gateway


class TestTheReferenceWorkersAnswer:
    async def test_a_viewer_from_the_start_gets_every_token_then_the_end_in_order(
        self, gw: Gateway
    ) -> None:
        viewer = await gw.connected()

        await Chat(gw).answer()

        frames = await ended(viewer)
        assert [f.event for f in frames[1:]] == ["queued", "answer"] + ["token"] * len(ANSWER) + [
            "answer",
            "done",
        ]
        assert text_seen(frames) == "".join(ANSWER)
        # One sequence of ids: stage events keep their seqs, tokens theirs, and the stage
        # events after the tokens follow them.
        ids = [f.id for f in frames[1:]]
        assert ids == [0, 160, *range(1001, 1011), 1011, 1012]

    async def test_the_stage_events_after_the_tokens_are_not_stale(self, gw: Gateway) -> None:
        chat = Chat(gw)
        await chat.stage(160, "answer", "started")
        await chat.tokens(ANSWER[:3])

        gw.h.xadd("job-1", 161, stage="answer", status="completed")
        gw.h.xadd("job-1", 181, stage="done", status="completed")
        result = await gw.h.route(await gw.h.read())

        assert result.verdicts == {Verdict.NEW: 2}

    async def test_the_end_carries_the_texts_size_and_hash(self, gw: Gateway) -> None:
        viewer = await gw.connected()

        await Chat(gw).answer()

        done = (await ended(viewer))[-1]
        text = "".join(ANSWER).encode()
        assert done.data["text_check"] == {
            "bytes": len(text),
            "sha1": hashlib.sha1(text).hexdigest(),
            "truncated": False,
        }

    async def test_a_repeated_token_entry_is_not_appended_twice(self, gw: Gateway) -> None:
        chat = Chat(gw)
        await chat.tokens(ANSWER[:2])
        gw.h.xadd("job-1", 1002, stage="token", status="streaming", content=ANSWER[1])
        result = await gw.h.route(await gw.h.read())

        text = await gw.h.store.text("scan", "job-1")

        assert result.verdicts == {Verdict.DUPLICATE: 1}
        assert text is not None
        assert text.text.decode() == "".join(ANSWER[:2])

    async def test_tokens_and_stage_events_in_one_batch_keep_their_stream_order(
        self, gw: Gateway
    ) -> None:
        viewer = await gw.connected()
        gw.h.xadd("job-1", 160, stage="answer", status="started")
        for n, delta in enumerate(ANSWER[:3]):
            gw.h.xadd("job-1", 1001 + n, stage="token", status="streaming", content=delta)
        gw.h.xadd("job-1", 161, stage="answer", status="completed")

        await gw.h.route(await gw.h.read())

        frames = await seen(viewer, 6)
        assert [(f.id, f.event) for f in frames[1:]] == [
            (160, "answer"),
            (1001, "token"),
            (1002, "token"),
            (1003, "token"),
            (1004, "answer"),
        ]


class TestResuming:
    @pytest.mark.parametrize("cut_after", [0, 1, 2, 5, 9, 10])
    async def test_a_viewer_resuming_after_any_frame_ends_with_the_exact_text(
        self, gw: Gateway, cut_after: int
    ) -> None:
        chat = Chat(gw)
        first = await gw.connected()
        await chat.stage(0, "queued", "started")
        await chat.stage(160, "answer", "started")
        await chat.tokens(ANSWER)
        before_cut = (await seen(first, 3 + len(ANSWER)))[: 3 + cut_after]
        await first.disconnect()
        await chat.stage(161, "answer", "completed")
        await chat.stage(181, "done", "completed")

        resumed = await ended(gw.connect(last_event_id=last_event_id(before_cut)))

        assert text_seen([*before_cut, *resumed]) == "".join(ANSWER)
        assert resumed[-1].event == "done"
        # Constant cost: at most one frame stands for the missed tokens.
        assert sum(f.event in ("token", "token_recovery") for f in resumed) <= 1

    async def test_a_late_joiner_gets_one_recovery_with_the_whole_text(self, gw: Gateway) -> None:
        chat = Chat(gw)
        await chat.stage(160, "answer", "started")
        await chat.tokens(ANSWER)

        viewer = await gw.connected()
        await chat.tokens(["…"])
        await chat.stage(161, "answer", "completed")
        await chat.stage(181, "done", "completed")

        frames = await ended(viewer)
        recovery = next(f for f in frames if f.event == "token_recovery")
        assert recovery.id == 1010
        assert recovery.data["accumulated"] == "".join(ANSWER)
        assert (recovery.data["last_seq"], recovery.data["completed"]) == (1010, False)
        assert recovery.data["nodes"] == {"answer": "".join(ANSWER)}
        assert text_seen(frames) == "".join(ANSWER) + "…"

    async def test_a_viewer_after_the_end_gets_the_text_then_the_end(self, gw: Gateway) -> None:
        await Chat(gw).answer()

        frames = await ended(gw.connect())

        assert [f.event for f in frames] == ["queued", "answer", "token_recovery", "answer", "done"]
        assert text_seen(frames) == "".join(ANSWER)

    async def test_a_viewer_that_has_the_end_is_told_it_ended(self, gw: Gateway) -> None:
        await Chat(gw).answer()

        assert await gw.stream.already_ended("scan", "job-1", 1012)
        assert not await gw.stream.already_ended("scan", "job-1", 1005)


class TestATokenWrittenAfterTheEnd:
    """A worker that writes a token after its job's `done` (a retry racing the end, a buggy
    worker): the end ends the text, whatever comes after it."""

    async def hello_world_then_a_late_token(self, gw: Gateway, *, one_batch: bool) -> None:
        """queued (10), "Hello", " ", "world" (1001-1003), done (180, id 1004), then "!"."""
        if one_batch:
            streaming = {"stage": "token", "status": "streaming"}
            gw.h.xadd("job-1", 10, stage="queued", status="started")
            for seq, delta in ((1001, "Hello"), (1002, " "), (1003, "world")):
                gw.h.xadd("job-1", seq, content=delta, **streaming)
            gw.h.xadd("job-1", 180, stage="done", status="completed")
            gw.h.xadd("job-1", 1004, content="!", **streaming)
            await gw.h.route(await gw.h.read())
            return
        chat = Chat(gw)
        await chat.stage(10, "queued", "started")
        await chat.tokens(["Hello", " ", "world"])
        await chat.stage(180, "done", "completed")
        await chat.tokens(["!"])

    @pytest.mark.parametrize("one_batch", [False, True], ids=["routed apart", "one batch"])
    async def test_a_viewer_after_the_end_gets_the_whole_text_then_the_end(
        self, gw: Gateway, one_batch: bool
    ) -> None:
        await self.hello_world_then_a_late_token(gw, one_batch=one_batch)

        frames = await ended(gw.connect())

        assert [(f.id, f.event) for f in frames] == [
            (10, "queued"),
            (1003, "token_recovery"),
            (1004, "done"),
        ]
        assert text_seen(frames) == "Hello world"
        assert frames[-1].data["text_check"] == {
            "bytes": 11,
            "sha1": hashlib.sha1(b"Hello world").hexdigest(),
            "truncated": False,
        }

    async def test_the_stored_text_is_the_one_the_ends_check_describes(self, gw: Gateway) -> None:
        await self.hello_world_then_a_late_token(gw, one_batch=False)

        text = await gw.h.store.text("scan", "job-1")

        assert text is not None
        assert (text.text, text.last_id) == (b"Hello world", 1003)

    async def test_a_resume_from_the_end_is_told_the_job_ended(self, gw: Gateway) -> None:
        await self.hello_world_then_a_late_token(gw, one_batch=False)

        resumed = gw.connect(last_event_id=1004)

        assert await gw.stream.already_ended("scan", "job-1", 1004)
        assert await ended(resumed) == []

    async def test_late_tokens_are_counted_stale_and_warned_of_once_for_the_job(
        self, gw: Gateway, caplog: pytest.LogCaptureFixture
    ) -> None:
        chat = Chat(gw)
        await chat.tokens(["Hello"])
        await chat.stage(180, "done", "completed")

        with caplog.at_level(logging.WARNING, logger="eco_router.application.route_batch"):
            await chat.tokens(["!", "?"])
            await chat.tokens(["."])

        assert gw.h.metrics.verdicts[("scan", Verdict.STALE)] == 3
        warned = [r.getMessage() for r in caplog.records if "after its end" in r.getMessage()]
        assert warned == [
            "a token of scan job job-1 was written after its end (done or failed): it and "
            "the job's later tokens are not routed"
        ]


class TestMissedLiveEvents:
    async def test_tokens_applied_but_never_published_reach_the_viewer_with_the_next(
        self, gw: Gateway
    ) -> None:
        # A router that died between its apply and its publish: the entries come back, are
        # judged duplicates (the text has them), and the next token tells the viewer.
        chat = Chat(gw)
        viewer = await gw.connected()
        await chat.tokens(ANSWER[:2])
        real_broadcast = gw.h.broadcaster.broadcast

        async def lost(events: Sequence[EncodedEvent]) -> None:
            raise BroadcastFailed("the router died here")

        gw.h.broadcaster.broadcast = lost  # type: ignore[method-assign]
        await chat.tokens(ANSWER[2:5])
        gw.h.broadcaster.broadcast = real_broadcast  # type: ignore[method-assign]
        await gw.h.route(await gw.h.redeliver())
        await chat.tokens(ANSWER[5:])

        await eventually(lambda: text_seen(frames_of(viewer.frames)) == "".join(ANSWER))
        assert [f.event for f in frames_of(viewer.frames)][-1] == "token_recovery"
        await viewer.disconnect()

    async def test_a_slow_viewers_dropped_tokens_come_back_as_a_recovery(self) -> None:
        gw = Gateway(queue_size=2)
        await gw.h.source.prepare()
        viewer = Viewer(gw.stream("scan", "job-1", None))
        await eventually(lambda: gw.metrics.active == 1)
        chat = Chat(gw)

        # Every token in one batch: the viewer's queue of 2 overflows before it reads.
        await chat.tokens(ANSWER)
        await chat.stage(181, "done", "completed")

        frames = await ended(viewer)
        assert text_seen(frames) == "".join(ANSWER)
        assert frames[-1].event == "done"

    async def test_a_retried_attempt_restarts_the_text_and_fences_the_old_one(
        self, gw: Gateway
    ) -> None:
        chat = Chat(gw)
        viewer = await gw.connected()
        await chat.tokens(["old ", "text"], attempt=0)
        chat.next_token_seq = 1001  # the retried task counts from the start again
        await chat.tokens(["new ", "answer"], attempt=1)
        gw.h.xadd("job-1", 1003, stage="token", status="streaming", content="late", attempt=0)
        late = await gw.h.route(await gw.h.read())
        await chat.stage(181, "done", "completed")

        frames = await ended(viewer)
        assert late.verdicts == {Verdict.STALE: 1}
        assert any(f.event == "token_recovery" for f in frames)
        assert text_seen(frames) == "new answer"

    async def test_an_end_lost_on_its_way_still_ends_a_quiet_stream(self) -> None:
        gw = Gateway(recheck_s=0.2)
        await gw.h.source.prepare()
        chat = Chat(gw)
        await chat.tokens(ANSWER[:2])
        viewer = await gw.connected()
        real_broadcast = gw.h.broadcaster.broadcast

        async def dropped(events: Sequence[EncodedEvent]) -> None:
            """Published, but the message never reaches this gateway."""

        gw.h.broadcaster.broadcast = dropped  # type: ignore[method-assign]
        await chat.stage(181, "done", "completed")
        gw.h.broadcaster.broadcast = real_broadcast  # type: ignore[method-assign]
        gw.h.clock.advance(300)

        frames = await ended(viewer)
        assert frames[-1].event == "done"


class TestTheTextsLimit:
    async def test_tokens_past_the_limit_are_not_routed_and_the_end_says_truncated(self) -> None:
        gw = Gateway()
        store = gw.h.store
        store._limits = dataclasses.replace(store._limits, text_max_bytes=12)  # type: ignore[attr-defined]
        await gw.h.source.prepare()
        viewer = await gw.connected()
        chat = Chat(gw)

        await chat.tokens(["12345", "67890", "abc", "d"])
        await chat.stage(181, "done", "completed")

        frames = await ended(viewer)
        assert text_seen(frames) == "1234567890"
        assert frames[-1].data["text_check"]["truncated"] is True
        assert gw.h.metrics.verdicts[("scan", Verdict.TEXT_FULL)] == 2
