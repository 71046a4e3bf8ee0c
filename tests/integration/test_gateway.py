"""The SSE gateway end to end: `eco-router serve` processes on real Redis, a producer, SSE clients.

Tests that only read share one gateway per module (unique job ids keep them apart); tests that
need their own configuration, count connections or restart a server start their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from eco_router.producer import AsyncStreamPublisher, producer_config
from eco_router.testing import RedisServer
from tests.integration.sse_client import SseEvent, open_sse, read_events, sse_client
from tests.integration.support import (
    CHANNEL_PREFIX,
    GROUP,
    PubSubCollector,
    WorkerProcess,
    Workers,
    eventually,
    job_state,
    metric_value,
    worker_env,
)
from tests.tcp_relay import Mode, TcpRelay

SECRET = "gateway-integration-tests-secret-0123456789"
COOKIE = "eco_router_token"
PRODUCER = producer_config(domain="scan", shards=4)

# seq -> (stage, status) under the default stage plan (vision, rule, answer, reward).
STEPS: dict[int, tuple[str, str]] = {
    0: ("queued", "queued"),
    10: ("vision", "started"),
    11: ("vision", "completed"),
    20: ("rule", "started"),
    21: ("rule", "completed"),
    30: ("answer", "started"),
    31: ("answer", "completed"),
    32: ("answer", "failed"),
    51: ("done", "done"),
}


# --- the gateway process ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Gateway(WorkerProcess):
    """One `eco-router serve` child process (HTTP app with the router inside)."""

    streams_url = ""
    pubsub_url = ""

    @classmethod
    def launch(
        cls,
        log_dir: Path,
        *,
        streams_url: str,
        pubsub_url: str,
        demo: bool = False,
        no_router: bool = False,
        **env: str,
    ) -> Gateway:
        """Serve on a free port; returns once /ready answers 200 (another port if it was taken)."""
        name = env.setdefault("EVENT_ROUTER_CONSUMER_NAME", f"gateway-{uuid.uuid4().hex[:6]}")
        env.setdefault("EVENT_ROUTER_READ_BLOCK_MS", "100")
        env.setdefault("EVENT_ROUTER_SSE_KEEPALIVE_S", "1")
        for attempt in range(3):
            port = free_port()
            args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
            args += ["--demo"] if demo else []
            args += ["--no-router"] if no_router else []
            log_path = log_dir / f"{name}-{attempt}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [*cls.command(), *args],
                    env=worker_env(streams_url, pubsub_url, **env),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            gateway = cls(process, log_path, name)
            gateway.base_url = f"http://127.0.0.1:{port}"
            gateway.streams_url, gateway.pubsub_url = streams_url, pubsub_url
            if gateway.wait_ready():
                return gateway
        raise AssertionError(f"gateway could not start\n{gateway.log_tail()}")

    def wait_ready(self, timeout_s: float = 15.0) -> bool:
        """True once /ready answers 200; False if the process ended first (port taken)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.base_url, timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/ready").status_code == 200:
                        return True
                time.sleep(0.05)
        self.ensure_dead()
        raise AssertionError(f"gateway not ready within {timeout_s} s\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class Gateways:
    """Starts gateways for one test and stops them at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self.started: list[Gateway] = []

    def start(
        self,
        *,
        streams_url: str,
        pubsub_url: str,
        demo: bool = False,
        no_router: bool = False,
        **env: str,
    ) -> Gateway:
        gateway = Gateway.launch(
            self._log_dir,
            streams_url=streams_url,
            pubsub_url=pubsub_url,
            demo=demo,
            no_router=no_router,
            **env,
        )
        self.started.append(gateway)
        return gateway

    async def start_async(self, *, streams_url: str, pubsub_url: str, **env: str) -> Gateway:
        """`start` off the event loop, for gateways that reach Redis through the test's relay."""
        return await asyncio.to_thread(
            lambda: self.start(streams_url=streams_url, pubsub_url=pubsub_url, demo=False, **env)
        )

    def stop_all(self) -> None:
        for gateway in self.started:
            gateway.stop()


@contextlib.contextmanager
def module_gateway(
    factory: pytest.TempPathFactory, name: str, *, demo: bool = False, **env: str
) -> Iterator[Gateway]:
    """A gateway on its own pair of servers, for the tests of one module."""
    with RedisServer() as streams, RedisServer() as pubsub:
        gateway = Gateway.launch(
            factory.mktemp(name), streams_url=streams.url, pubsub_url=pubsub.url, demo=demo, **env
        )
        try:
            yield gateway
        finally:
            gateway.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Shared: open to everyone, demo jobs on."""
    with module_gateway(tmp_path_factory, "open-gateway", demo=True) as started:
        yield started


@pytest.fixture(scope="module")
def secured_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Shared: every stream needs a JWT signed with SECRET."""
    with module_gateway(
        tmp_path_factory, "secured-gateway", EVENT_ROUTER_JWT_SECRET=SECRET
    ) as started:
        yield started


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    launcher = Gateways(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
def own_gateway(
    gateways: Gateways, streams_server: RedisServer, pubsub_server: RedisServer
) -> Gateway:
    """This test's own gateway on the test's servers, demo jobs off, /metrics on."""
    return gateways.start(
        streams_url=streams_server.url,
        pubsub_url=pubsub_server.url,
        EVENT_ROUTER_GATEWAY_METRICS="true",
    )


Producers = Callable[[Gateway], AsyncStreamPublisher]
Clients = Callable[[str], Redis]


@pytest.fixture
async def redis_at() -> AsyncIterator[Clients]:
    """Clients for any server URL, created in the test's loop and closed after it."""
    clients: list[Redis] = []

    def connect(url: str) -> Redis:
        client = Redis.from_url(url)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        await client.aclose()


@pytest.fixture
def producer_for(redis_at: Clients) -> Producers:
    """The producer SDK on a gateway's streams server."""
    return lambda gateway: AsyncStreamPublisher(redis_at(gateway.streams_url), PRODUCER)


# --- producing and reading -------------------------------------------------------------------


def new_job(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


def events_path(job_id: str, domain: str = "scan") -> str:
    return f"/api/v1/{domain}/{job_id}/events"


async def publish(publisher: AsyncStreamPublisher, job_id: str, *seqs: int) -> None:
    """The producer's events for `seqs` of the plan, in the order given."""
    for seq in seqs:
        stage, status = STEPS[seq]
        result: Any = None
        if status == "done":
            result = {"label": "cat", "score": 0.9}
        elif status == "failed":
            result = {"error": f"{stage} timed out"}
        await publisher.publish_stage_event(job_id, stage, status, result=result)


async def routed(redis: Redis, job_id: str, seq: int) -> None:
    """Wait until the router has applied the job up to `seq` (or beyond)."""

    async def reached() -> bool:
        state = await job_state(redis, job_id)
        return state is not None and state["seq"] >= seq

    await eventually(reached, what=f"{job_id} routed up to seq {seq}")


def ids_and_names(events: list[SseEvent]) -> list[tuple[str | None, str]]:
    return [(e.id, e.event) for e in events]


def without_snapshots(events: list[SseEvent]) -> list[SseEvent]:
    return [e for e in events if e.event != "snapshot"]


def token(jobs: list[str], *, secret: str = SECRET, expires_in_s: int = 300) -> str:
    claims = {"jobs": jobs, "exp": int(time.time()) + expires_in_s}
    return jwt.encode(claims, secret, algorithm="HS256")


async def status_of(
    base_url: str,
    path: str,
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> int:
    """The status of a stream request, without waiting for a body that may never end."""
    async with (
        sse_client(base_url) as http,
        open_sse(http, path, params=params, headers=headers) as stream,
    ):
        return stream.status_code


def resume_request(
    way: str, job_id: str, last_event_id: str | None
) -> tuple[str, dict[str, str], dict[str, str]]:
    """Path, query and headers of a (re)connection the way a client of `way` makes it."""
    path, params, headers = events_path(job_id), {}, {}
    if way == "legacy route":
        path, params = "/api/v1/stream", {"job_id": job_id}
    if last_event_id is not None:
        if way == "query parameter":
            params["last_event_id"] = last_event_id
        else:
            headers["Last-Event-ID"] = last_event_id
    return path, params, headers


async def subscribed_channels(pubsub: Redis) -> set[str]:
    names = await pubsub.pubsub_channels(f"{CHANNEL_PREFIX}:*")
    return {n.decode() if isinstance(n, bytes) else n for n in names}


async def no_channels(pubsub: Redis) -> bool:
    return not await subscribed_channels(pubsub)


async def feed_connection(pubsub: Redis) -> str:
    [feed] = [c for c in await pubsub.client_list() if int(c["sub"]) > 0]
    return str(feed["id"])


async def feed_subscribed(pubsub: Redis, job_id: str) -> bool:
    return f"{CHANNEL_PREFIX}:{job_id}" in await subscribed_channels(pubsub)


# --- tests -----------------------------------------------------------------------------------


class TestEndToEnd:
    async def test_published_events_arrive_in_order_with_seq_ids_and_the_stream_ends_after_done(
        self, gateway: Gateway, producer_for: Producers
    ) -> None:
        job = new_job("e2e")
        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as stream:
            assert stream.status_code == 200
            assert stream.response.headers["content-type"].startswith("text/event-stream")
            # The snapshot is written after the subscription: everything published now is live.
            [first] = await stream.read(1)
            await publish(producer_for(gateway), job, 0, 10, 11, 20, 21, 30, 31, 51)
            events = await stream.read_to_end()

        assert first.event == "snapshot"
        assert ids_and_names(events) == [
            ("0", "queued"),
            ("10", "vision"),
            ("11", "vision"),
            ("20", "rule"),
            ("21", "rule"),
            ("30", "answer"),
            ("31", "answer"),
            ("51", "done"),
        ]
        payloads = [e.json() for e in events]
        assert [(p["job_id"], p["seq"]) for p in payloads] == [(job, e.seq) for e in events]
        assert payloads[-1]["result"] == {"label": "cat", "score": 0.9}

    async def test_a_failed_event_is_sent_as_error_and_ends_the_stream(
        self, gateway: Gateway, producer_for: Producers
    ) -> None:
        job = new_job("failing")
        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as stream:
            await stream.read(1)
            await publish(producer_for(gateway), job, 0, 10, 11, 20, 21, 30, 32)
            events = await stream.read_to_end()

        assert ids_and_names(events)[-2:] == [("30", "answer"), ("32", "error")]
        assert events[-1].json()["status"] == "failed"
        assert events[-1].json()["result"] == {"error": "answer timed out"}


class TestReconnecting:
    @pytest.mark.parametrize("way", ["Last-Event-ID header", "query parameter", "legacy route"])
    async def test_a_client_back_after_a_disconnect_gets_exactly_the_events_it_missed(
        self, way: str, gateway: Gateway, producer_for: Producers, redis_at: Clients
    ) -> None:
        producer, redis = producer_for(gateway), redis_at(gateway.streams_url)
        job = new_job("resume")
        await publish(producer, job, 0, 10, 11)
        await routed(redis, job, 11)

        async with sse_client(gateway.base_url) as http:
            path, params, headers = resume_request(way, job, None)
            before = await read_events(http, path, count=3, params=params, headers=headers)
            await publish(producer, job, 20, 21, 30)
            await routed(redis, job, 30)
            path, params, headers = resume_request(way, job, before[-1].id)
            async with open_sse(http, path, params=params, headers=headers) as stream:
                assert stream.status_code == 200
                replayed = await stream.read(3)
                await publish(producer, job, 51)
                after = replayed + await stream.read_to_end()

        assert ids_and_names(before) == [("0", "queued"), ("10", "vision"), ("11", "vision")]
        assert ids_and_names(after) == [
            ("20", "rule"),
            ("21", "rule"),
            ("30", "answer"),
            ("51", "done"),
        ]

    @pytest.mark.parametrize("way", ["Last-Event-ID header", "query parameter", "legacy route"])
    async def test_a_client_back_after_the_jobs_end_is_told_to_stop_with_204(
        self, way: str, gateway: Gateway, producer_for: Producers, redis_at: Clients
    ) -> None:
        job = new_job("ended")
        await publish(producer_for(gateway), job, 0, 10, 51)
        await routed(redis_at(gateway.streams_url), job, 51)

        async with sse_client(gateway.base_url) as http:
            path, params, headers = resume_request(way, job, "51")
            ended = await http.get(path, params=params, headers=headers)
            path, params, headers = resume_request(way, job, "10")
            async with open_sse(http, path, params=params, headers=headers) as stream:
                status_before_the_end = stream.status_code
                rest = await stream.read_to_end()

        assert (ended.status_code, ended.content) == (204, b"")
        assert status_before_the_end == 200
        assert ids_and_names(rest) == [("51", "done")]


class TestIdleJobs:
    async def test_a_job_whose_done_was_lost_ends_its_streams_and_resuming_viewers_get_204(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        producer_for: Producers,
        redis_at: Clients,
    ) -> None:
        # The idle limit is 2 s here instead of the default 600 s: what is checked (the end,
        # its frame, the 204 afterwards) does not depend on its length.
        gateway = gateways.start(
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            EVENT_ROUTER_SSE_JOB_IDLE_S="2",
        )
        redis, pubsub = redis_at(streams_server.url), redis_at(pubsub_server.url)
        job = new_job("idle")
        await publish(producer_for(gateway), job, 0, 10)
        await routed(redis, job, 10)
        # `done` as the router published it, whose write a failover then lost: the viewers
        # got it, the job's state stays at seq 10, and no end will come from the store.
        lost_done = {"job_id": job, "seq": 51, "stage": "done", "status": "done", "domain": "scan"}

        async with sse_client(gateway.base_url) as http:
            async with open_sse(http, events_path(job)) as saw_the_end:
                seen = await saw_the_end.read(2)
                await pubsub.publish(f"{CHANNEL_PREFIX}:{job}", json.dumps(lost_done))
                seen += await saw_the_end.read_to_end()
            async with open_sse(http, events_path(job)) as waiting:
                waited = await waiting.read_to_end()
            back_after_the_end = await http.get(events_path(job), headers={"Last-Event-ID": "51"})
            back_after_10 = await http.get(events_path(job), headers={"Last-Event-ID": "10"})

        assert ids_and_names(seen) == [("0", "queued"), ("10", "vision"), ("51", "done")]
        assert ids_and_names(waited) == [("0", "queued"), ("10", "vision"), (None, "error")]
        assert json.loads(waited[-1].data) == {"error": "idle"}
        assert (back_after_the_end.status_code, back_after_the_end.content) == (204, b"")
        assert (back_after_10.status_code, back_after_10.content) == (204, b"")


class TestSnapshots:
    async def test_an_unknown_job_gets_a_snapshot_without_id_first_then_its_events(
        self, gateway: Gateway, producer_for: Producers
    ) -> None:
        job = new_job("unknown")
        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as stream:
            [first] = await stream.read(1)
            await publish(producer_for(gateway), job, 0)
            [second] = await stream.read(1)

        assert (first.id, first.event, first.json()) == (
            None,
            "snapshot",
            {"job_id": job, "state": None},
        )
        assert (second.id, second.event) == ("0", "queued")

    async def test_a_known_job_with_its_whole_history_gets_no_snapshot(
        self, gateway: Gateway, producer_for: Producers, redis_at: Clients
    ) -> None:
        job = new_job("known")
        await publish(producer_for(gateway), job, 0, 10)
        await routed(redis_at(gateway.streams_url), job, 10)
        async with sse_client(gateway.base_url) as http:
            events = await read_events(http, events_path(job), count=2)

        assert ids_and_names(events) == [("0", "queued"), ("10", "vision")]

    @pytest.mark.parametrize(
        ("last_event_id", "expected"),
        [
            ("0", [(None, "snapshot"), ("20", "rule"), ("21", "rule"), ("30", "answer")]),
            (None, [(None, "snapshot"), ("20", "rule"), ("21", "rule"), ("30", "answer")]),
            ("20", [("21", "rule"), ("30", "answer")]),
        ],
        ids=["older-than-history", "new-client", "within-history"],
    )
    async def test_a_resume_point_the_full_history_no_longer_reaches_gets_a_snapshot_first(
        self,
        last_event_id: str | None,
        expected: list[tuple[str | None, str]],
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        producer_for: Producers,
        redis_at: Clients,
    ) -> None:
        gateway = gateways.start(
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            EVENT_ROUTER_HISTORY_SIZE="3",
        )
        job = new_job("trimmed")
        await publish(producer_for(gateway), job, 0, 10, 11, 20, 21, 30)
        await routed(redis_at(gateway.streams_url), job, 30)
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        async with sse_client(gateway.base_url) as http:
            events = await read_events(http, events_path(job), count=len(expected), headers=headers)

        assert ids_and_names(events) == expected
        if expected[0][1] == "snapshot":
            assert events[0].json()["job_id"] == job
            assert events[0].json()["state"]["seq"] == 30  # the job's state


class TestRequestValidation:
    @pytest.mark.parametrize(
        "job_id", ["a{b", "a*b", "a b", "j" * 129], ids=["brace", "star", "space", "129-chars"]
    )
    async def test_a_job_id_outside_the_allowed_pattern_is_422(
        self, job_id: str, gateway: Gateway
    ) -> None:
        assert await status_of(gateway.base_url, events_path(job_id)) == 422
        assert await status_of(gateway.base_url, "/api/v1/stream", params={"job_id": job_id}) == 422

    async def test_a_job_id_of_128_allowed_characters_is_accepted(self, gateway: Gateway) -> None:
        job = "A-z_0.9:" * 16
        async with sse_client(gateway.base_url) as http:
            [first] = await read_events(http, events_path(job), count=1)

        assert first.json() == {"job_id": job, "state": None}

    @pytest.mark.parametrize(
        ("way", "last_event_id"),
        [
            ("Last-Event-ID header", "abc"),
            ("Last-Event-ID header", "-1"),
            ("Last-Event-ID header", "1.5"),
            ("query parameter", "abc"),
            ("query parameter", "-1"),
            ("query parameter", "\u0663"),  # ARABIC-INDIC DIGIT THREE: a digit, not ASCII
            ("Last-Event-ID header", "9" * 5000),  # int() refuses past 4300 digits
            ("query parameter", "9" * 5000),
            ("Last-Event-ID header", str(2**63)),  # one past the largest seq
        ],
    )
    async def test_a_last_event_id_that_is_not_a_non_negative_integer_is_422(
        self, way: str, last_event_id: str, gateway: Gateway
    ) -> None:
        path, params, headers = resume_request(way, new_job("bad-id"), last_event_id)

        assert await status_of(gateway.base_url, path, params=params, headers=headers) == 422

    async def test_an_unknown_domain_is_404(self, gateway: Gateway) -> None:
        assert await status_of(gateway.base_url, events_path("job-1", "billing")) == 404
        assert await status_of(gateway.base_url, events_path("job-1", "chat")) == 200


class TestAuthorization:
    async def test_a_request_without_a_token_is_401_with_a_bearer_challenge(
        self, secured_gateway: Gateway
    ) -> None:
        async with sse_client(secured_gateway.base_url) as http:
            response = await http.get(events_path(new_job("no-token")))

        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"

    @pytest.mark.parametrize(
        "bad_token",
        [
            token(["*"], expires_in_s=-60),
            token(["*"], secret="another-secret-of-a-decent-length-0123456789"),
            "not-a-jwt",
        ],
        ids=["expired", "badly-signed", "garbage"],
    )
    async def test_an_expired_or_badly_signed_token_is_401(
        self, bad_token: str, secured_gateway: Gateway
    ) -> None:
        headers = {"Authorization": f"Bearer {bad_token}"}

        assert (
            await status_of(secured_gateway.base_url, events_path("job-1"), headers=headers) == 401
        )

    async def test_a_token_for_another_job_is_403(self, secured_gateway: Gateway) -> None:
        headers = {"Authorization": f"Bearer {token(['someone-else'])}"}

        assert (
            await status_of(secured_gateway.base_url, events_path("mine"), headers=headers) == 403
        )

    @pytest.mark.parametrize("carrier", ["bearer header", "cookie", "wildcard claim"])
    async def test_a_token_granting_the_job_opens_the_stream(
        self, carrier: str, secured_gateway: Gateway
    ) -> None:
        job = new_job("granted")
        granted = token(["*"] if carrier == "wildcard claim" else ["other", job])
        headers = (
            {"Cookie": f"{COOKIE}={granted}"}
            if carrier == "cookie"
            else {"Authorization": f"Bearer {granted}"}
        )
        async with sse_client(secured_gateway.base_url) as http:
            [first] = await read_events(http, events_path(job), count=1, headers=headers)

        assert (first.event, first.json()["job_id"]) == ("snapshot", job)

    async def test_tokens_never_reach_the_log(self, secured_gateway: Gateway) -> None:
        job = new_job("logged")
        path = events_path(job)
        granted, forbidden, expired = token([job]), token(["other"]), token([job], expires_in_s=-9)
        async with sse_client(secured_gateway.base_url) as http:
            by_header = await read_events(
                http, path, count=1, headers={"Authorization": f"Bearer {granted}"}
            )
            by_cookie = await read_events(
                http, path, count=1, headers={"Cookie": f"{COOKIE}={granted}"}
            )
            refused = await http.get(path, headers={"Authorization": f"Bearer {forbidden}"})
            stale = await http.get(path, headers={"Cookie": f"{COOKIE}={expired}"})

        assert [len(by_header), len(by_cookie), refused.status_code, stale.status_code] == [
            1,
            1,
            403,
            401,
        ]
        # Every request made it to the access log: the log is really being written.
        await eventually(lambda: secured_gateway.log().count(path) >= 4, what="access log lines")
        log = secured_gateway.log()
        for sent in (granted, forbidden, expired):
            assert sent.rsplit(".", 1)[1] not in log  # not even its signature


class TestOnePubSubConnection:
    async def test_twenty_viewers_share_one_connection_and_their_channels_go_when_they_leave(
        self, own_gateway: Gateway, pubsub_redis: Redis
    ) -> None:
        jobs = [new_job(f"viewer-{n}") for n in range(20)]
        async with sse_client(own_gateway.base_url) as http, contextlib.AsyncExitStack() as stack:
            streams = [
                await stack.enter_async_context(open_sse(http, events_path(job))) for job in jobs
            ]
            firsts = await asyncio.gather(*(stream.read(1) for stream in streams))
            connections = await pubsub_redis.client_list()
            channels = await subscribed_channels(pubsub_redis)

        assert [first.event for [first] in firsts] == ["snapshot"] * 20
        in_pubsub_mode = [c for c in connections if int(c["sub"]) > 0 or "P" in c["flags"]]
        assert [(c["name"], int(c["sub"])) for c in in_pubsub_mode] == [("eco-router-pubsub", 20)]
        assert channels == {f"{CHANNEL_PREFIX}:{job}" for job in jobs}
        await eventually(
            lambda: no_channels(pubsub_redis), what="every channel unsubscribed", timeout_s=10
        )
        metrics = (await own_gateway.get("/metrics")).text
        assert metric_value(metrics, "event_router_gateway_connections_active") == 0
        closed = "event_router_gateway_connections_closed_total"
        assert metric_value(metrics, closed, reason="disconnect") == 20


class TestPubSubOutages:
    async def test_events_published_while_the_pubsub_server_restarts_reach_the_viewer(
        self,
        own_gateway: Gateway,
        pubsub_server: RedisServer,
        producer_for: Producers,
        redis_at: Clients,
    ) -> None:
        producer, redis = producer_for(own_gateway), redis_at(own_gateway.streams_url)
        job = new_job("outage")
        async with (
            sse_client(own_gateway.base_url) as http,
            open_sse(http, events_path(job)) as stream,
        ):
            await stream.read(1)
            await publish(producer, job, 0, 10)
            before = await stream.read(2)
            pubsub_server.stop()
            await publish(producer, job, 11, 20, 21)
            # Applied (the first of them at least) while nothing could be published.
            await routed(redis, job, 11)
            pubsub_server.start()
            await publish(producer, job, 30, 31, 51)
            after = await stream.read_to_end(timeout_s=30)

        assert ids_and_names(before) == [("0", "queued"), ("10", "vision")]
        # The history holds everything after 10: caught up with no snapshot, so the client
        # is not told of a gap it does not have.
        assert "snapshot" not in [e.event for e in after]
        assert [e.seq for e in after] == [11, 20, 21, 30, 31, 51]

    async def test_viewers_coming_and_going_while_the_pubsub_server_is_dead_get_a_retry(
        self,
        own_gateway: Gateway,
        pubsub_server: RedisServer,
        producer_for: Producers,
        redis_at: Clients,
    ) -> None:
        """A killed server: streams closed meanwhile leave a connection the loop closed, new
        ones are refused with 503 (never 500), and a stream left open catches up after."""
        producer, redis = producer_for(own_gateway), redis_at(own_gateway.streams_url)
        job = new_job("stays")
        async with (
            sse_client(own_gateway.base_url) as http,
            open_sse(http, events_path(job)) as stream,
            contextlib.AsyncExitStack() as leaving,
        ):
            await stream.read(1)
            for n in range(5):
                other = await leaving.enter_async_context(
                    open_sse(http, events_path(new_job(f"leaves-{n}")))
                )
                await other.read(1)
            pubsub_server.kill()
            await leaving.aclose()
            refused = [(await http.get(events_path(new_job("new")))) for _ in range(5)]
            await publish(producer, job, 10)
            await routed(redis, job, 10)
            pubsub_server.start()
            await publish(producer, job, 51)
            after = await stream.read_to_end(timeout_s=30)

        assert [r.status_code for r in refused] == [503] * 5
        assert all(r.headers.get("Retry-After") for r in refused)
        assert [e.seq for e in after] == [10, 51]
        log = own_gateway.log()
        assert "Exception in ASGI application" not in log
        assert "Traceback" not in log

    async def test_events_lost_while_the_feed_reconnects_at_once_are_caught_up(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        pubsub_redis: Redis,
        producer_for: Producers,
    ) -> None:
        """The connection is cut but the server stays up: redis-py reconnects on its own."""
        async with (
            TcpRelay(pubsub_server.port) as relay,
            PubSubCollector(pubsub_server.url) as published,
        ):
            gateway = await gateways.start_async(
                streams_url=streams_server.url, pubsub_url=relay.url
            )
            producer = producer_for(gateway)
            job = new_job("cut")
            async with (
                sse_client(gateway.base_url) as http,
                open_sse(http, events_path(job)) as stream,
            ):
                await stream.read(1)
                await publish(producer, job, 0)
                before = await stream.read(1)
                relay.set_mode(Mode.HOLD)
                feed_id = await feed_connection(pubsub_redis)
                await pubsub_redis.client_kill_filter(_id=feed_id)
                # Published to nobody: the feed's new connection is still in its handshake.
                await publish(producer, job, 10, 11)
                await eventually(lambda: published.seqs(job) == [0, 10, 11], what="published")
                relay.set_mode(Mode.PASS)
                await eventually(lambda: feed_subscribed(pubsub_redis, job), what="resubscribed")
                await publish(producer, job, 51)
                after = await stream.read_to_end()

        assert ids_and_names(before) == [("0", "queued")]
        assert "snapshot" not in [e.event for e in after]
        assert [e.seq for e in after] == [10, 11, 51]


class TestMetrics:
    async def test_gateway_metrics_count_connections_and_events_sent(
        self, own_gateway: Gateway, producer_for: Producers, redis_at: Clients
    ) -> None:
        producer = producer_for(own_gateway)
        job = new_job("metered")
        await publish(producer, job, 0)
        await routed(redis_at(own_gateway.streams_url), job, 0)
        async with (
            sse_client(own_gateway.base_url) as http,
            open_sse(http, events_path(job)) as stream,
        ):
            replayed = await stream.read(1)
            await publish(producer, job, 10, 51)
            live = await stream.read_to_end()

        assert [e.seq for e in replayed + live] == [0, 10, 51]

        async def settled() -> str | None:
            text = (await own_gateway.get("/metrics")).text
            closed = metric_value(text, "event_router_gateway_connections_closed_total")
            return text if closed >= 1 else None

        text = await eventually(settled, what="connection closed")
        assert text is not None
        counts = {
            "opened": metric_value(text, "event_router_gateway_connections_opened_total"),
            "active": metric_value(text, "event_router_gateway_connections_active"),
            "closed done": metric_value(
                text, "event_router_gateway_connections_closed_total", reason="done"
            ),
            "replayed": metric_value(
                text, "event_router_gateway_events_sent_total", source="replay"
            ),
            "live": metric_value(text, "event_router_gateway_events_sent_total", source="live"),
            "latencies": metric_value(text, "event_router_gateway_delivery_latency_seconds_count"),
            "snapshots": metric_value(text, "event_router_gateway_snapshots_sent_total"),
        }
        assert counts == {
            "opened": 1,
            "active": 0,
            "closed done": 1,
            "replayed": 1,
            "live": 2,
            "latencies": 2,
            "snapshots": 0,
        }


class TestDemoJobs:
    async def test_a_demo_job_streams_to_done_with_a_result(self, gateway: Gateway) -> None:
        async with sse_client(gateway.base_url) as http:
            response = await http.post("/api/v1/demo/jobs")
            assert response.status_code == 201, response.text
            created = response.json()
            events = without_snapshots(await read_events(http, created["events"], timeout_s=20))

        assert created["domain"] == "scan"
        assert created["events"] == events_path(created["job_id"])
        seqs = [e.seq for e in events]
        assert seqs[0] == 0
        assert seqs == sorted(set(seqs))
        assert events[-1].event == "done"
        assert set(events[-1].json()["result"]) == {"label", "score"}

    async def test_without_demo_the_endpoint_is_404(self, own_gateway: Gateway) -> None:
        async with sse_client(own_gateway.base_url) as http:
            response = await http.post("/api/v1/demo/jobs")

        assert response.status_code == 404

    async def test_with_a_secret_the_demo_hands_the_page_a_cookie_for_its_job_only(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
    ) -> None:
        secured = gateways.start(
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            demo=True,
            EVENT_ROUTER_JWT_SECRET=SECRET,
        )
        async with sse_client(secured.base_url) as http:
            response = await http.post("/api/v1/demo/jobs")
            assert response.status_code == 201, response.text
            created = response.json()
            claims = jwt.decode(http.cookies["eco_router_token"], SECRET, algorithms=["HS256"])
            events = without_snapshots(await read_events(http, created["events"], timeout_s=20))
            other = await http.get(events_path("someone-elses-job"))

        assert claims["jobs"] == [created["job_id"]]
        assert events[-1].event == "done"
        assert other.status_code == 403


class TestWithoutARouter:
    async def test_a_gateway_that_does_not_route_streams_what_a_worker_routes(
        self,
        gateways: Gateways,
        workers: Workers,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        producer_for: Producers,
        redis_at: Clients,
    ) -> None:
        gateway = gateways.start(
            streams_url=streams_server.url, pubsub_url=pubsub_server.url, no_router=True
        )
        redis = redis_at(streams_server.url)
        job = new_job("sse-only")
        async with sse_client(gateway.base_url) as http:
            ready = (await http.get("/ready")).json()
            async with open_sse(http, events_path(job)) as stream:
                [snapshot] = await stream.read(1)
                await publish(producer_for(gateway), job, 0)
                await workers.start()
                await publish(producer_for(gateway), job, 10, 51)
                events = await stream.read_to_end()
            consumers = await group_consumers(redis)

        assert ready == {
            "ready": True,
            "checks": {"streams": "ok", "pubsub": "ok", "feed": "ok", "presence": "ok"},
        }
        assert snapshot.event == "snapshot"
        assert ids_and_names(events) == [("0", "queued"), ("10", "vision"), ("51", "done")]
        assert gateway.name not in consumers
        assert consumers  # the worker's

    def test_no_router_without_redis_is_a_usage_error(self) -> None:
        done = subprocess.run(
            [*Gateway.command(), "serve", "--in-memory", "--no-router"],
            capture_output=True,
            text=True,
            timeout=30,
        )

        assert done.returncode == 2
        assert "--no-router needs Redis" in done.stderr


async def group_consumers(redis: Redis) -> set[str]:
    """The consumers the group knows on any shard of `scan:events`."""
    names: set[str] = set()
    for shard in range(4):
        with contextlib.suppress(ResponseError):
            for consumer in await redis.xinfo_consumers(f"scan:events:{shard}", GROUP):
                names.add(consumer["name"].decode())
    return names


class TestShutdown:
    async def test_sigterm_ends_open_streams_at_once_and_the_client_resumes_elsewhere(
        self,
        gateways: Gateways,
        worker: WorkerProcess,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        producer_for: Producers,
    ) -> None:
        servers = {"streams_url": streams_server.url, "pubsub_url": pubsub_server.url}
        leaving = gateways.start(**servers, no_router=True)
        staying = gateways.start(**servers, no_router=True)
        producer = producer_for(leaving)
        job = new_job("shutdown")
        async with sse_client(leaving.base_url) as http, open_sse(http, events_path(job)) as cut:
            await cut.read(1)
            await publish(producer, job, 0, 10)
            before = await cut.read(2)
            leaving.terminate()
            ended = await cut.read_to_end()
            code = await leaving.wait_exit()
        async with sse_client(staying.base_url) as http:
            headers = {"Last-Event-ID": before[-1].id or ""}
            async with open_sse(http, events_path(job), headers=headers) as resumed:
                await publish(producer, job, 51)
                after = await resumed.read_to_end()

        assert ids_and_names(before) == [("0", "queued"), ("10", "vision")]
        assert ended == []
        assert code == 0
        assert "graceful shutdown exceeded" not in leaving.log()
        assert ids_and_names(after) == [("51", "done")]
