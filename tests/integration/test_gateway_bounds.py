"""The gateway stays bounded against hostile or broken clients, on real sockets and real Redis."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.event_feed import RedisPubSubEventFeed
from eco_router.testing import RedisServer
from tests.integration.served_gateway import ServedGateway, gateway_settings, served_gateway
from tests.integration.sse_client import open_sse, sse_client
from tests.integration.support import CHANNEL_PREFIX

QUEUE_SIZE = 256  # the documented default of EVENT_ROUTER_SSE_QUEUE_SIZE


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from the test alone, never from the shell that runs it."""
    for name in list(os.environ):
        if name.startswith(("EVENT_ROUTER_", "REDIS_")) or name == "POD_NAME":
            monkeypatch.delenv(name)


@pytest.fixture
async def served(
    streams_server: RedisServer, pubsub_server: RedisServer
) -> AsyncIterator[ServedGateway]:
    async with served_gateway(gateway_settings(streams_server.url, pubsub_server.url)) as gateway:
        yield gateway


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

        assert refused.status_code == 503, refused.json()
        assert refused.headers["Retry-After"] == "5"
        assert "subscribe" in refused.json()["detail"], refused.json()
        assert channels_while_down == 0  # nothing left behind by the refused request
        assert (status_once_back, snapshot.event) == (200, "snapshot")
        assert [(e.id, e.event) for e in rest if e.event != "snapshot"] == [("1", "done")]
