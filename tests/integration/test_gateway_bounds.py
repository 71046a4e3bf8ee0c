"""The gateway stays bounded against hostile or broken clients, on real sockets and real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.testing import RedisServer
from tests.environment import clear_settings
from tests.integration.served_gateway import ServedGateway, gateway_settings, served_gateway
from tests.integration.sse_client import open_sse, sse_client
from tests.integration.support import CHANNEL_PREFIX, eventually
from tests.integration.test_gateway import Gateway, Gateways
from tests.raw_http import PATIENCE_S, address_of, connected, until_closed

QUEUE_SIZE = 256  # the documented default of EVENT_ROUTER_SSE_QUEUE_SIZE


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


@pytest.fixture
async def served(
    streams_server: RedisServer, pubsub_server: RedisServer
) -> AsyncIterator[ServedGateway]:
    async with served_gateway(gateway_settings(streams_server.url, pubsub_server.url)) as gateway:
        yield gateway


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    launcher = Gateways(tmp_path)
    yield launcher
    launcher.stop_all()


def new_job(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


def events_path(job_id: str) -> str:
    return f"/api/v1/scan/{job_id}/events"


def payload(job_id: str, seq: int, *, status: str, padding: int = 0) -> bytes:
    stage = "done" if status == "done" else "vision"
    message = {"job_id": job_id, "domain": "scan", "seq": seq, "stage": stage, "status": status}
    if padding:
        message["result"] = "x" * padding
    return orjson.dumps(message)


def stalled_client(base_url: str) -> httpx.AsyncClient:
    """A client with a small receive buffer: once it stops reading, the server's writes stall
    after a few megabytes at most instead of filling an auto-tuned buffer of megabytes."""
    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)]
    )
    return httpx.AsyncClient(base_url=base_url, transport=transport, trust_env=False)


class TestClientsThatStopReading:
    async def test_a_flood_of_terminal_events_to_a_stalled_client_keeps_its_queue_bounded(
        self, served: ServedGateway, pubsub_redis: Redis
    ) -> None:
        feed = await served.feed()
        assert isinstance(feed, RedisPubSubEventFeed)
        stalled_job, other_job = new_job("stalled"), new_job("reading")
        stalled_channel = f"{CHANNEL_PREFIX}:{stalled_job}"
        async with (
            stalled_client(served.base_url) as stalled_http,
            open_sse(stalled_http, events_path(stalled_job)) as stalled,
            sse_client(served.base_url) as http,
            open_sse(http, events_path(other_job)) as other,
        ):
            assert (stalled.status_code, other.status_code) == (200, 200)
            [snapshot] = await other.read(1)
            # The stalled client reads nothing more: 8 MB of progress fill every buffer
            # between it and the gateway, so the gateway's writes to it block...
            for seq in range(1, 1001):
                await pubsub_redis.publish(
                    stalled_channel, payload(stalled_job, seq, status="running", padding=8192)
                )
            # ... while the job's channel is flooded with terminal events.
            async with pubsub_redis.pipeline(transaction=False) as pipe:
                for seq in range(1001, 6001):
                    pipe.publish(stalled_channel, payload(stalled_job, seq, status="done"))
                await pipe.execute()
            # One Pub/Sub connection delivers in order: once the reading client has this,
            # the gateway has queued the whole flood.
            await pubsub_redis.publish(
                f"{CHANNEL_PREFIX}:{other_job}", payload(other_job, 1, status="done")
            )
            [marker] = await other.read(1, timeout_s=30)
            lengths = feed.queue_lengths()

            assert snapshot.event == "snapshot"
            assert (marker.id, marker.event) == ("1", "done")
            # The stalled viewer is still subscribed, with a queue no longer than the bound.
            assert len(lengths) == 1
            assert 0 < lengths[0] <= QUEUE_SIZE

            # Read again: the client is told of the gap, and its stream ends with the last end.
            events = await stalled.read(None, timeout_s=60, stop_at_terminal=False)

        assert "snapshot" in [e.event for e in events[1:]]
        assert (events[-1].event, events[-1].seq) == ("done", 6000)
        assert [e.event for e in events].count("done") == 1


async def no_subscriptions(pubsub: Redis) -> bool:
    return not await pubsub.pubsub_channels()


class TestPubSubDown:
    async def test_a_stream_opened_while_pubsub_is_down_is_503_and_opens_once_it_is_back(
        self, served: ServedGateway, pubsub_server: RedisServer, pubsub_redis: Redis
    ) -> None:
        feed = await served.feed()
        assert isinstance(feed, RedisPubSubEventFeed)
        job = new_job("pubsub-down")
        pubsub_server.stop()
        async with sse_client(served.base_url) as http:
            refused = await http.get(events_path(job), headers={"Accept": "text/event-stream"})
            channels_while_down = feed.channels
            pubsub_server.start()
            async with open_sse(http, events_path(job)) as stream:
                status_once_back = stream.status_code
                [snapshot] = await stream.read(1)
                await pubsub_redis.publish(
                    f"{CHANNEL_PREFIX}:{job}", payload(job, 1, status="done")
                )
                # (a snapshot may come first: the feed's reconnect is treated as a gap)
                rest = await stream.read()
            # Nothing stays subscribed, the refused request's channel included.
            await eventually(lambda: no_subscriptions(pubsub_redis), what="channels released")

        assert refused.status_code == 503, refused.json()
        assert refused.headers["Retry-After"] == "5"
        # The cause (redis-py's text, with the server's address) is for the log only.
        assert refused.json() == {"detail": "pubsub unavailable, retry later"}
        assert channels_while_down == 0  # nothing left behind by the refused request
        assert (status_once_back, snapshot.event) == (200, "snapshot")
        assert [(e.id, e.event) for e in rest if e.event != "snapshot"] == [("1", "done")]


# --- slow and idle connections, on an `eco-router serve` process -------------------------------

# Short timeouts keep the tests short; what they check does not depend on the values.
QUICK_TIMEOUTS = {
    "EVENT_ROUTER_HTTP_HEADER_TIMEOUT_S": "1",
    "EVENT_ROUTER_HTTP_IDLE_TIMEOUT_S": "1",
}


@pytest.fixture(params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest) -> str:
    """EVENT_ROUTER_HTTP_PARSER: the slow-client bounds hold with either parser."""
    value: str = request.param
    return value


@pytest.fixture
def quick_gateway(
    gateways: Gateways, streams_server: RedisServer, pubsub_server: RedisServer, parser: str
) -> Gateway:
    return gateways.start(
        streams_url=streams_server.url,
        pubsub_url=pubsub_server.url,
        EVENT_ROUTER_HTTP_PARSER=parser,
        **QUICK_TIMEOUTS,
    )


HEALTH = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"


class TestSlowClients:
    async def test_a_connection_that_never_finishes_its_headers_is_closed(
        self, quick_gateway: Gateway
    ) -> None:
        async with (
            connected(address_of(quick_gateway.base_url)) as (partial, partial_writer),
            connected(address_of(quick_gateway.base_url)) as (silent, _),
        ):
            partial_writer.write(b"GET /health HTTP/1.1\r\nHost: gateway\r\nX-Slow: a")
            await partial_writer.drain()

            assert await until_closed(partial) == b""
            assert await until_closed(silent) == b""
        async with sse_client(quick_gateway.base_url) as http:
            assert (await http.get("/health")).status_code == 200

    async def test_a_kept_alive_connection_that_starts_a_request_and_stalls_is_closed(
        self, quick_gateway: Gateway
    ) -> None:
        async with connected(address_of(quick_gateway.base_url)) as (reader, writer):
            writer.write(HEALTH)
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), PATIENCE_S)
            writer.write(b"GET /health HTTP/1.1\r\nHo")
            await writer.drain()
            rest = await until_closed(reader)

        assert status_line.startswith(b"HTTP/1.1 200")
        assert rest.count(b"HTTP/1.1") == 0  # the stalled request got no answer

    async def test_an_idle_kept_alive_connection_is_closed(self, quick_gateway: Gateway) -> None:
        async with connected(address_of(quick_gateway.base_url)) as (reader, writer):
            writer.write(HEALTH)
            await writer.drain()
            answered = await until_closed(reader)

        assert answered.startswith(b"HTTP/1.1 200")

    async def test_past_the_connection_cap_a_request_is_503_until_connections_close(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        parser: str,
    ) -> None:
        gateway = gateways.start(
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS="3",
            EVENT_ROUTER_HTTP_PARSER=parser,
            **QUICK_TIMEOUTS,
        )
        async with contextlib.AsyncExitStack() as stack:
            held = [
                await stack.enter_async_context(connected(address_of(gateway.base_url)))
                for _ in "abc"
            ]
            async with connected(address_of(gateway.base_url)) as (reader, writer):
                writer.write(HEALTH)
                await writer.drain()
                refused = await until_closed(reader)
            for reader, _ in held:  # they sent nothing: the header timeout closes them
                assert await until_closed(reader) == b""
        async with sse_client(gateway.base_url) as http:
            after = await http.get("/health")

        assert refused.startswith(b"HTTP/1.1 503")
        assert after.status_code == 200

    async def test_past_twice_the_cap_a_connection_is_dropped_unanswered(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        parser: str,
    ) -> None:
        gateway = gateways.start(
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS="1",
            EVENT_ROUTER_HTTP_PARSER=parser,
        )
        async with contextlib.AsyncExitStack() as stack:
            for _ in "ab":  # the cap, then one past it: twice the cap in all
                await stack.enter_async_context(connected(address_of(gateway.base_url)))
            async with connected(address_of(gateway.base_url)) as (reader, writer):
                writer.write(HEALTH)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                try:
                    answer = await until_closed(reader)
                except ConnectionResetError:
                    answer = b""

        assert answer == b""

    async def test_a_flood_of_connections_never_runs_out_of_file_descriptors(
        self, tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
    ) -> None:
        gateway = FewFilesGateway.launch(
            tmp_path,
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            **QUICK_TIMEOUTS,
        )
        try:
            host, port = gateway.base_url.removeprefix("http://").split(":")
            flood = await asyncio.gather(
                *(asyncio.open_connection(host, int(port)) for _ in range(FLOOD)),
                return_exceptions=True,
            )
            for opened in flood:
                if not isinstance(opened, BaseException):
                    opened[1].close()
            # The flood is gone (closed, or timed out at the server): served again.
            health = await eventually(lambda: healthy(gateway.base_url), what="/health answers")
            log = gateway.log()
        finally:
            gateway.stop()

        assert "out of system resource" not in log  # asyncio's accept error
        assert "Traceback" not in log
        assert "capping connections at 88" in log  # what 256 open files allow
        assert health


# Twice what the process may open: without a cap that fits its open-file limit it would run
# out of descriptors and log accept errors.
FLOOD = 512


class FewFilesGateway(Gateway):
    """`eco-router serve` in a shell whose open-file limit (soft and hard) is low."""

    OPEN_FILES = 256

    @staticmethod
    def command() -> list[str]:
        limit = f"ulimit -n {FewFilesGateway.OPEN_FILES}"
        return ["sh", "-c", f'{limit} && exec "$0" "$@"', *Gateway.command()]


async def healthy(base_url: str) -> bool:
    async with sse_client(base_url) as http:
        try:
            return (await http.get("/health")).status_code == 200
        except httpx.TransportError:
            return False


class TestStreamsPerClient:
    async def test_past_the_cap_per_address_a_stream_is_429_until_one_closes(
        self, streams_server: RedisServer, pubsub_server: RedisServer
    ) -> None:
        settings = gateway_settings(streams_server.url, pubsub_server.url, sse_max_per_client=2)
        async with (
            served_gateway(settings) as served,
            sse_client(served.base_url) as http,
            open_sse(http, events_path(new_job("first"))) as first,
        ):
            async with open_sse(http, events_path(new_job("second"))) as second:
                [snapshot] = await second.read(1)
                async with open_sse(http, events_path(new_job("third"))) as third:
                    refused = (third.status_code, third.response.headers.get("Retry-After"))
                assert refused == (429, "5")
            await eventually(lambda: served_streams(served) == 1, what="the second one released")
            async with open_sse(http, events_path(new_job("again"))) as again:
                status_again = again.status_code

        assert (first.status_code, snapshot.event) == (200, "snapshot")
        assert status_again == 200

    async def test_console_streams_count_toward_the_cap_per_address(
        self, streams_server: RedisServer, pubsub_server: RedisServer
    ) -> None:
        settings = gateway_settings(
            streams_server.url, pubsub_server.url, sse_max_per_client=1, console=True
        )
        async with (
            served_gateway(settings) as served,
            sse_client(served.base_url) as http,
            open_sse(http, "/console/api/stream") as console,
            open_sse(http, events_path(new_job("job"))) as job,
        ):
            refused = (job.status_code, job.response.headers.get("Retry-After"))

        assert console.status_code == 200
        assert refused == (429, "5")


def served_streams(served: ServedGateway) -> int:
    return int(served.app.state.client_streams.open_streams("127.0.0.1"))
