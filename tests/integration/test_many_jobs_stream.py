"""Many jobs on one stream (`GET /api/v1/streams`) end to end: `eco-router serve` on real
Redis, the producer SDK and a chat worker's raw entries, raw SSE clients.

Every frame names its job; a reconnect with the Last-Event-ID of a cut connection resumes
every job exactly, a chat job with one `token_recovery` for the tokens it missed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import jwt
import pytest
from redis.asyncio import Redis

from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer
from tests.browser.test_reference_chat import stage_entry, token_entry, token_seq
from tests.integration.sse_client import SseEvent, SseStream, open_sse, sse_client
from tests.integration.support import CHAT, eventually
from tests.integration.test_gateway import (
    SECRET,
    Clients,
    Gateway,
    Producers,
    module_gateway,
    new_job,
    producer_for,
    publish,
    redis_at,
    routed,
)

# Fixtures of the gateway's tests, used here too.
__all__ = ["producer_for", "redis_at"]

PATH = "/api/v1/streams"
READ_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with module_gateway(
        tmp_path_factory, "many-jobs", EVENT_ROUTER_GATEWAY_METRICS="true"
    ) as started:
        yield started


@pytest.fixture(scope="module")
def secured_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with module_gateway(
        tmp_path_factory, "many-jobs-secured", EVENT_ROUTER_JWT_SECRET=SECRET
    ) as started:
        yield started


def of_job(frames: Sequence[SseEvent], domain: str, job_id: str) -> list[tuple[str, object]]:
    """(event, data) of one job's frames, unwrapped."""
    out = []
    for frame in frames:
        body = frame.json()
        assert set(body) == {"domain", "job_id", "data"}, frame
        if (body["domain"], body["job_id"]) == (domain, job_id):
            out.append((frame.event, body["data"]))
    return out


def seqs(frames: Sequence[SseEvent], job_id: str) -> list[int]:
    return [
        d["seq"] for e, d in of_job(frames, "scan", job_id) if isinstance(d, dict) and "seq" in d
    ]


async def read_until(stream: SseStream, done: object) -> list[SseEvent]:
    """Events until `done(events so far)` holds."""
    got: list[SseEvent] = []
    while not done(got):  # type: ignore[operator]
        event = await stream.next_event(READ_TIMEOUT_S)
        assert event is not None, f"the stream ended early: {got}"
        got.append(event)
    return got


def text_of(frames: Sequence[SseEvent], chat_job: str) -> str:
    """A chat job's text as the reference frontend rebuilds it: `token` appends its content,
    `token_recovery` replaces the text with its accumulated."""
    text = ""
    for event, data in of_job(frames, "chat", chat_job):
        assert isinstance(data, dict)
        if event == "token":
            text += data["content"]
        elif event == "token_recovery":
            text = data["accumulated"]
    return text


def token(claims: dict[str, object]) -> str:
    return jwt.encode({"exp": int(time.time()) + 300, **claims}, SECRET, algorithm="HS256")


async def chat_entries(redis: Redis, job_id: str, *entries: dict[str, str]) -> None:
    for entry in entries:
        await redis.xadd(CHAT.stream_for(job_id), entry)


class TestManyJobs:
    async def test_every_jobs_events_arrive_named_and_the_stream_ends_after_the_last_done(
        self, gateway: Gateway, producer_for: Producers
    ) -> None:
        jobs = [new_job(f"many-{i}") for i in range(3)]
        params = [("job", f"scan:{j}") for j in jobs]
        producer = producer_for(gateway)
        async with sse_client(gateway.base_url) as http:
            async with open_sse(http, PATH, params=params) as stream:
                assert stream.status_code == 200
                # One snapshot per job not started: subscribed, so what follows is live.
                await stream.read(3)
                for job in jobs:
                    await publish(producer, job, 0, 10, 11)
                for job in reversed(jobs):
                    await publish(producer, job, 20, 51)
                events = await stream.read_to_end(READ_TIMEOUT_S)
                last = events[-1].id
            ended = await http.get(PATH, params=params, headers={"Last-Event-ID": last or ""})

        for job in jobs:
            assert seqs(events, job) == [0, 10, 11, 20, 51]
            assert of_job(events, "scan", job)[-1][0] == "done"
        assert ended.status_code == 204

    async def test_a_cut_connection_resumes_every_job_exactly_and_a_chat_job_recovers_its_text(
        self, gateway: Gateway, producer_for: Producers, redis_at: Clients
    ) -> None:
        scan_job, chat_job = new_job("many-scan"), new_job("many-chat")
        redis = redis_at(gateway.streams_url)
        producer = producer_for(gateway)
        params = [("job", f"scan:{scan_job}"), ("job", f"chat:{chat_job}")]
        await publish(producer, scan_job, 0, 10)
        deltas = [f"w{n} " for n in range(1, 13)]
        await chat_entries(
            redis,
            chat_job,
            stage_entry(chat_job, "queued", "started", 0),
            *(token_entry(chat_job, token_seq(n), deltas[n - 1]) for n in range(1, 5)),
        )
        await routed(redis, scan_job, 10)

        def seen_first(got: list[SseEvent]) -> bool:
            return len(seqs(got, scan_job)) == 2 and text_of(got, chat_job) == "".join(deltas[:4])

        async with sse_client(gateway.base_url) as http:
            async with open_sse(http, PATH, params=params) as stream:
                before = await read_until(stream, seen_first)
            last = before[-1].id
            assert last is not None
            await publish(producer, scan_job, 11, 20)
            await chat_entries(
                redis,
                chat_job,
                *(token_entry(chat_job, token_seq(n), deltas[n - 1]) for n in range(5, 13)),
            )
            headers = {"Last-Event-ID": last}
            async with open_sse(http, PATH, params=params, headers=headers) as stream:
                assert stream.status_code == 200
                await publish(producer, scan_job, 51)
                await chat_entries(redis, chat_job, stage_entry(chat_job, "done", "completed", 181))
                after = await stream.read_to_end(READ_TIMEOUT_S)

        assert seqs(before, scan_job) + seqs(after, scan_job) == [0, 10, 11, 20, 51]
        assert text_of(before + after, chat_job) == "".join(deltas)
        chat_after = [e for e, _ in of_job(after, "chat", chat_job)]
        assert chat_after.count("token_recovery") <= 1
        assert chat_after[-1] == "done"

    async def test_each_job_watched_counts_as_a_viewer_of_it_until_the_stream_closes(
        self, gateway: Gateway
    ) -> None:
        jobs = [new_job(f"viewed-{i}") for i in range(3)]
        params = [("job", f"scan:{j}") for j in jobs]

        async def watched_are(viewers: float, jobs_watched: float) -> bool:
            return (
                await gateway.metric("event_router_gateway_viewers", domain="scan"),
                await gateway.metric("event_router_gateway_jobs_watched", domain="scan"),
            ) == (viewers, jobs_watched)

        async with sse_client(gateway.base_url) as http, open_sse(http, PATH, params=params) as s:
            await s.read(3)
            await eventually(lambda: watched_are(3, 3), what="3 jobs watched")
        await eventually(lambda: watched_are(0, 0), what="no job watched")


class TestRefusals:
    @pytest.mark.parametrize(
        ("params", "detail"),
        [
            ([("job", "nocolon")], "job must be domain:job_id"),
            ([("job", "mail:J1")], "unknown domain 'mail'"),
            ([("job", "scan:bad/id")], "job_id must be 1-128 characters"),
            ([("job", f"scan:j{i}") for i in range(51)], "at most 50 jobs per stream"),
            ([], "name the jobs"),
        ],
    )
    async def test_a_bad_job_set_is_422_with_one_line(
        self, gateway: Gateway, params: list[tuple[str, str]], detail: str
    ) -> None:
        async with sse_client(gateway.base_url) as http:
            answer = await http.get(PATH, params=params)
        assert answer.status_code == 422
        assert detail in answer.json()["detail"]

    @pytest.mark.parametrize(
        ("last_event_id", "detail"),
        [
            ("12", "not a stream id"),
            ("AAAAAAAA.1,2", "another set of jobs"),
            ("x" * 2000, "longer than a stream id"),
        ],
    )
    async def test_a_last_event_id_not_of_this_set_is_422(
        self, gateway: Gateway, last_event_id: str, detail: str
    ) -> None:
        params = [("job", "scan:a"), ("job", "scan:b")]
        async with sse_client(gateway.base_url) as http:
            answer = await http.get(PATH, params=params, headers={"Last-Event-ID": last_event_id})
        assert answer.status_code == 422
        assert detail in answer.json()["detail"]


class TestTokens:
    async def test_with_no_jobs_named_the_tokens_jobs_are_streamed(
        self, secured_gateway: Gateway, producer_for: Producers
    ) -> None:
        jobs = [new_job("claimed") for _ in range(2)]
        cookie = {"Authorization": f"Bearer {token({'domain': 'scan', 'jobs': jobs})}"}
        async with (
            sse_client(secured_gateway.base_url) as http,
            open_sse(http, PATH, headers=cookie) as stream,
        ):
            assert stream.status_code == 200
            snapshots = await stream.read(2)
            for job in jobs:
                await publish(producer_for(secured_gateway), job, 0, 51)
            events = await stream.read_to_end(READ_TIMEOUT_S)
        assert sorted(f.json()["job_id"] for f in snapshots) == sorted(jobs)
        for job in jobs:
            assert seqs(events, job) == [0, 51]

    async def test_every_job_must_be_granted(self, secured_gateway: Gateway) -> None:
        granted = {"Authorization": f"Bearer {token({'domain': 'scan', 'jobs': ['a']})}"}
        params = [("job", "scan:a"), ("job", "scan:b")]
        async with sse_client(secured_gateway.base_url) as http:
            forbidden = await http.get(PATH, params=params, headers=granted)
            anonymous = await http.get(PATH, params=params)
        assert (forbidden.status_code, anonymous.status_code) == (403, 401)

    async def test_a_wildcard_token_must_name_its_jobs(self, secured_gateway: Gateway) -> None:
        wildcard = {"Authorization": f"Bearer {token({'domain': 'scan', 'jobs': ['*']})}"}
        async with sse_client(secured_gateway.base_url) as http:
            answer = await http.get(PATH, headers=wildcard)
            async with open_sse(
                http,
                PATH,
                params=[("job", "scan:any")],
                headers=wildcard,
            ) as stream:
                opened = stream.status_code
        assert answer.status_code == 422
        assert "no finite set" in answer.json()["detail"]
        assert opened == 200

    async def test_an_admin_token_opens_any_named_jobs(self, secured_gateway: Gateway) -> None:
        admin = JwtAdminAuthorizer(SECRET).issue(ttl_s=300)
        async with (
            sse_client(secured_gateway.base_url) as http,
            open_sse(
                http,
                PATH,
                params=[("job", "scan:x"), ("job", "chat:y")],
                headers={"Authorization": f"Bearer {admin}"},
            ) as stream,
        ):
            assert stream.status_code == 200
            assert len(await stream.read(2)) == 2
