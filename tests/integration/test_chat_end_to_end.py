"""The reference chat worker's entries, byte for byte, through `eco-router serve` to a raw SSE
client: the answer's text rebuilt as the reference frontend rebuilds it is the worker's, and a
resume with Last-Event-ID costs one `token_recovery` for the tokens it missed, however many
tokens the answer has.

The worker (`tests/browser/test_reference_chat.py`) writes with a plain redis-py client, on
both of its token paths; each path runs on a gateway and servers of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest
import redis
from redis.asyncio import Redis

from tests.browser.test_reference_chat import (
    CHAT,
    FIRST_TOKEN_SEQ,
    NODE,
    ReferenceChatWorker,
    answer_deltas,
    stage_entry,
    text_up_to,
    token_entry,
    token_seq,
)
from tests.integration.sse_client import SseEvent, open_sse, read_events, sse_client
from tests.integration.support import GROUP, eventually, job_state
from tests.integration.test_gateway import Gateway, module_gateway

# The default families: the reference worker shards a job over four `chat:events` streams.
STREAMS = "scan:events=4,chat:events=4"
READ_TIMEOUT_S = 15.0


@pytest.fixture(scope="module", params=["plain", "v2"])
def token_path(request: pytest.FixtureRequest) -> str:
    """The reference worker's token path."""
    path: str = request.param
    return path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, token_path: str) -> Iterator[Gateway]:
    """`eco-router serve` (router inside) on servers of its own for each token path: one that
    upsets the router upsets only its own tests."""
    with module_gateway(tmp_path_factory, f"chat-{token_path}", EVENT_ROUTER_STREAMS=STREAMS) as gw:
        yield gw


def new_job() -> str:
    return f"chat-{uuid.uuid4().hex}"


def events_path(job_id: str) -> str:
    return f"/api/v1/chat/{job_id}/events"


def text_seen(frames: Sequence[SseEvent]) -> str:
    """The text as the reference frontend holds it: `token` appends its content,
    `token_recovery` replaces the text with its accumulated."""
    text = ""
    for frame in frames:
        if frame.event == "token":
            text += frame.json()["content"]
        elif frame.event == "token_recovery":
            text = frame.json()["accumulated"]
    return text


def with_ids(frames: Sequence[SseEvent]) -> list[SseEvent]:
    """The frames a reference frontend handles: a snapshot (of a job not known yet) has no id
    and no listener."""
    return [f for f in frames if f.id is not None]


async def until_done_routed(gateway: Gateway, job_id: str) -> None:
    client = Redis.from_url(gateway.streams_url)
    try:

        async def done() -> bool:
            state = await job_state(client, job_id, "chat")
            return state is not None and state.get("stage") == "done"

        await eventually(done, what=f"{job_id} done routed")
    finally:
        await client.aclose()


async def answered(gateway: Gateway, token_path: str, tokens: int) -> ReferenceChatWorker:
    """A whole answer of `tokens` tokens, written at once and routed up to its done."""
    worker = ReferenceChatWorker(
        gateway.streams_url,
        new_job(),
        answer_deltas(tokens),
        path=token_path,
        tokens_per_s=None,
    )
    await asyncio.to_thread(worker.run)
    await until_done_routed(gateway, worker.job_id)
    return worker


async def resumed(gateway: Gateway, job_id: str, after: int) -> list[SseEvent]:
    async with sse_client(gateway.base_url) as http:
        return await read_events(
            http,
            events_path(job_id),
            headers={"Last-Event-ID": str(after)},
            timeout_s=READ_TIMEOUT_S,
        )


class TestAViewerFromTheStart:
    async def test_one_frame_per_token_and_done_checks_the_text(
        self, gateway: Gateway, token_path: str
    ) -> None:
        worker = ReferenceChatWorker(
            gateway.streams_url, new_job(), answer_deltas(300), path=token_path
        )
        async with (
            sse_client(gateway.base_url) as http,
            open_sse(http, events_path(worker.job_id)) as stream,
        ):
            [snapshot] = await stream.read(1)
            async with asyncio.TaskGroup() as writing:
                writing.create_task(asyncio.to_thread(worker.run))
                frames = await stream.read(timeout_s=READ_TIMEOUT_S)

        assert snapshot.event == "snapshot"
        assert [f.event for f in frames] == [
            "queued",
            "intent",
            "intent",
            "answer",
            *["token"] * 300,
            "answer",
            "done",
        ]
        assert text_seen(frames) == worker.text
        data = worker.text.encode()
        assert frames[-1].json()["text_check"] == {
            "bytes": len(data),
            "sha1": hashlib.sha1(data, usedforsecurity=False).hexdigest(),
            "truncated": False,
        }


# Where a viewer may resume a finished answer of n tokens, and the frames it then gets: the
# same few whatever n, the tokens it missed in one `token_recovery`.
RESUMES_AFTER_THE_END: dict[str, tuple[Callable[[int], int], list[str]]] = {
    "after queued": (
        lambda n: 0,
        ["intent", "intent", "answer", "token_recovery", "answer", "done"],
    ),
    "after the answer started": (lambda n: 160, ["token_recovery", "answer", "done"]),
    "after the first token": (lambda n: token_seq(1), ["token_recovery", "answer", "done"]),
    "after a middle token": (lambda n: token_seq(n // 2), ["token_recovery", "answer", "done"]),
    "after the last token but one": (
        lambda n: token_seq(n - 1),
        ["token_recovery", "answer", "done"],
    ),
    "after the last token": (lambda n: token_seq(n), ["answer", "done"]),
    "after the answer completed": (lambda n: token_seq(n) + 1, ["done"]),
}


class TestAResumeAfterTheEnd:
    @pytest.mark.parametrize("tokens", [30, 300, 3000])
    async def test_costs_the_same_frames_however_many_tokens(
        self, gateway: Gateway, token_path: str, tokens: int
    ) -> None:
        worker = await answered(gateway, token_path, tokens)

        got = {
            point: [f.event for f in await resumed(gateway, worker.job_id, after(tokens))]
            for point, (after, _) in RESUMES_AFTER_THE_END.items()
        }

        assert got == {point: frames for point, (_, frames) in RESUMES_AFTER_THE_END.items()}

    async def test_each_recovery_holds_the_whole_text(
        self, gateway: Gateway, token_path: str
    ) -> None:
        worker = await answered(gateway, token_path, 300)

        for point, (after, _) in RESUMES_AFTER_THE_END.items():
            frames = await resumed(gateway, worker.job_id, after(300))
            recoveries = [f.json() for f in frames if f.event == "token_recovery"]
            assert [r["accumulated"] for r in recoveries] in ([worker.text], []), point
            assert [r["event_id"] for r in recoveries] in ([worker.last_token_seq], []), point

    async def test_after_done_the_browser_is_told_to_stop_reconnecting(
        self, gateway: Gateway, token_path: str
    ) -> None:
        worker = await answered(gateway, token_path, 30)
        done_id = token_seq(30) + 2

        async with (
            sse_client(gateway.base_url) as http,
            open_sse(
                http, events_path(worker.job_id), headers={"Last-Event-ID": str(done_id)}
            ) as stream,
        ):
            assert stream.status_code == 204


class TestATokenWrittenAfterTheEnd:
    """The worker writes one more token after its done (a retry racing the end, a buggy
    worker): the end ends the text."""

    async def late_token_routed(self, gateway: Gateway, job_id: str, seq: int) -> None:
        """One token after the job's end, written as the worker writes them; back once the
        router has read and acked it."""
        client = Redis.from_url(gateway.streams_url)
        stream = CHAT.stream_for(job_id)
        try:
            written = (await client.xadd(stream, token_entry(job_id, seq, "!"))).decode()

            async def acked() -> bool:
                group = next(
                    g for g in await client.xinfo_groups(stream) if g["name"].decode() == GROUP
                )
                delivered = group["last-delivered-id"].decode()
                caught_up = tuple(map(int, delivered.split("-"))) >= tuple(
                    map(int, written.split("-"))
                )
                return caught_up and group["pending"] == 0

            await eventually(acked, what=f"the late token of {job_id} routed")
        finally:
            await client.aclose()

    async def test_a_late_viewer_gets_the_whole_text_and_a_resume_from_done_gets_204(
        self, gateway: Gateway, token_path: str
    ) -> None:
        worker = await answered(gateway, token_path, 30)
        done_id = token_seq(30) + 2
        await self.late_token_routed(gateway, worker.job_id, token_seq(31))

        async with sse_client(gateway.base_url) as http:
            frames = await read_events(http, events_path(worker.job_id), timeout_s=READ_TIMEOUT_S)
            async with open_sse(
                http, events_path(worker.job_id), headers={"Last-Event-ID": str(done_id)}
            ) as stream:
                resumed = stream.status_code

        assert text_seen(frames) == worker.text
        assert (frames[-1].event, frames[-1].seq) == ("done", done_id)
        assert frames[-1].json()["text_check"]["bytes"] == len(worker.text.encode())
        assert resumed == 204


class TestResumesWhileTokensStream:
    async def test_each_resume_gets_one_recovery_then_follows_on_and_the_text_is_the_workers(
        self, gateway: Gateway, token_path: str
    ) -> None:
        # The viewer reads a random number of frames, drops the connection, stays away a
        # random while (tokens go on meanwhile) and resumes with the last id it got.
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        worker = ReferenceChatWorker(
            gateway.streams_url, new_job(), answer_deltas(600), path=token_path
        )
        connections: list[tuple[int | None, list[SseEvent]]] = []
        last_id: int | None = None
        async with sse_client(gateway.base_url) as http, asyncio.TaskGroup() as writing:
            writing.create_task(asyncio.to_thread(worker.run))
            while not (connections and connections[-1][1] and connections[-1][1][-1].terminal):
                headers = {} if last_id is None else {"Last-Event-ID": str(last_id)}
                async with open_sse(http, events_path(worker.job_id), headers=headers) as stream:
                    assert stream.status_code == 200, (last_id, seed)
                    frames = with_ids(
                        await stream.read(rng.randint(5, 80), timeout_s=READ_TIMEOUT_S)
                    )
                connections.append((last_id, frames))
                last_id = frames[-1].seq if frames else last_id
                await asyncio.sleep(rng.uniform(0.05, 0.3))
        why = f"seed {seed}, resumed after {[after for after, _ in connections]}"

        everything = [f for _, frames in connections for f in frames]
        assert text_seen(everything) == worker.text, why
        ids = [f.seq for f in everything]
        assert ids == sorted(set(ids)), why
        assert len(connections) >= 5, why
        resumes_with_a_recovery = [
            after
            for after, frames in connections[1:]
            if any(f.event == "token_recovery" for f in frames)
        ]
        assert len(resumes_with_a_recovery) >= 3, why
        for after, frames in connections[1:]:
            assert after is not None
            recoveries = [f for f in frames if f.event == "token_recovery"]
            assert len(recoveries) <= 1, why
            if recoveries:
                [recovery] = recoveries
                assert frames[0] is recovery, why
                body = recovery.json()
                assert body["accumulated"] == text_up_to(worker.deltas, body["last_seq"]), why
                assert body["nodes"] == {NODE: body["accumulated"]}, why
            # From the first token on, the ids follow on with no gap after the recovery (or
            # the resume point).
            start = max(recoveries[0].seq if recoveries else after, FIRST_TOKEN_SEQ - 1)
            rest = [f.seq for f in frames[len(recoveries) :] if f.seq >= FIRST_TOKEN_SEQ]
            assert rest == list(range(start + 1, start + 1 + len(rest))), why


class TestTheWorkersOwnKeys:
    async def test_the_v2_keys_disturb_neither_the_job_nor_another_read_after_it(
        self, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        with module_gateway(tmp_path_factory, "chat-v2-alone", EVENT_ROUTER_STREAMS=STREAMS) as gw:
            worker = ReferenceChatWorker(
                gw.streams_url, new_job(), answer_deltas(30), path="v2", tokens_per_s=None
            )
            neighbour = next(
                job
                for job in (f"chat-neighbour-{n}" for n in range(10_000))
                if CHAT.stream_for(job) == worker.stream
            )
            # The router reads both in one batch: the answer, then the next job on its shard.
            await asyncio.to_thread(write_together, worker, neighbour)
            redis = Redis.from_url(gw.streams_url, decode_responses=True)
            try:
                async with sse_client(gw.base_url) as http:
                    neighbour_frames = with_ids(
                        await read_events(http, events_path(neighbour), timeout_s=READ_TIMEOUT_S)
                    )
                    job_frames = await read_events(
                        http, events_path(worker.job_id), timeout_s=READ_TIMEOUT_S
                    )
                worker_tokens = await redis.xlen(f"chat:tokens:{worker.job_id}")
                worker_state = await redis.hgetall(f"chat:token_state:{worker.job_id}")
            finally:
                await redis.aclose()

        assert [f.event for f in neighbour_frames] == ["queued", "done"]
        assert text_seen(job_frames) == worker.text
        assert job_frames[-1].event == "done"
        assert worker_tokens == 30
        assert worker_state["accumulated"] == worker.text


def write_together(worker: ReferenceChatWorker, neighbour: str) -> None:
    """In one transaction: the worker's whole answer, then another job's queued and done."""
    client = redis.Redis.from_url(worker.url, decode_responses=True)
    try:
        with client.pipeline(transaction=True) as pipe:
            worker.write(pipe)
            pipe.xadd(worker.stream, stage_entry(neighbour, "queued", "started", 0))
            done = stage_entry(neighbour, "done", "completed", 181, result={"answer": "ok"})
            pipe.xadd(worker.stream, done)
            pipe.execute()
    finally:
        client.close()
