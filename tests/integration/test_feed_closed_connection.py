"""The gateway's Pub/Sub feed when its connection is closed under a viewer's leave or
subscribe (the server dies): a retry for the viewer, never redis-py's or the loop's raw error.

The hang-up is seen, and the reader's reconnect runs, over the first few turns of the event
loop after the server's death, in an order each loop keeps to itself: a write in one turn
finds the transport the loop closed (uvloop: RuntimeError), in another the writer the
reader's disconnect took away (AttributeError on `writelines`). Each test runs its step at
every one of those turns, on asyncio's loop and on uvloop's, which `serve` uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvloop
from redis.asyncio import Redis

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.redis.connections.connection import redis_client
from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.adapters.redis.router.broadcaster import RedisPubSubBroadcaster
from eco_router.application.errors import TransientError
from eco_router.application.ports import FeedSubscription
from eco_router.testing import RedisServer
from tests.contracts.event_feed import seqs
from tests.contracts.factories import encoded

pytestmark = pytest.mark.integration

PREFIX = "sse:closed-connection"
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {
    "asyncio": None,
    "uvloop": uvloop.new_event_loop,
}
TURNS = range(6)


def run_on(loop: str, scenario: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(scenario)


@asynccontextmanager
async def started_feed(server: RedisServer) -> AsyncIterator[RedisPubSubEventFeed]:
    """A feed on the gateway's own client for `server` (socket timeout, health checks)."""
    client, _ = redis_client(server.url, socket_timeout_s=5.0, client_name="closed-connection")
    feed = RedisPubSubEventFeed(
        client,
        channel_prefix=PREFIX,
        decoder=OrjsonEventDecoder(),
        metrics=InMemoryGatewayMetrics(),
        confirm_timeout_s=5.0,
    )
    await feed.start()
    try:
        yield feed
    finally:
        await feed.stop()
        await client.aclose()


async def turns_of_the_loop(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def served_once_back(
    feed: RedisPubSubEventFeed, server: RedisServer, job_id: str
) -> FeedSubscription:
    """After a restart: a viewer of `job_id` as soon as the feed confirms one (refused with
    `TransientError` until it has reconnected), that gets what is published."""
    server.start()
    for _ in range(500):
        try:
            viewer = await feed.subscribe("scan", job_id)
            break
        except TransientError:
            await asyncio.sleep(0.01)
    else:
        raise AssertionError("the feed never came back")
    publisher = Redis.from_url(server.url)
    try:
        await RedisPubSubBroadcaster(publisher, channel_prefix=PREFIX).broadcast(
            [encoded(job_id=job_id, seq=1)]
        )
    finally:
        await publisher.aclose()
    return viewer


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("turns", TURNS)
class TestAServerThatDies:
    def test_a_viewer_leaving_meanwhile_leaves_without_an_error(
        self, pubsub_server: RedisServer, loop: str, turns: int
    ) -> None:
        async def scenario() -> None:
            async with started_feed(pubsub_server) as feed:
                viewer = await feed.subscribe("scan", "job-1")
                pubsub_server.kill()
                await turns_of_the_loop(turns)

                await viewer.close()

                assert feed.channels == 0
                back = await served_once_back(feed, pubsub_server, "job-2")
                assert await seqs(back, 1) == [1]

        run_on(loop, scenario())

    def test_a_viewer_subscribing_meanwhile_is_refused_with_a_retry(
        self, pubsub_server: RedisServer, loop: str, turns: int
    ) -> None:
        async def scenario() -> None:
            async with started_feed(pubsub_server) as feed:
                await feed.subscribe("scan", "job-1")
                pubsub_server.kill()
                await turns_of_the_loop(turns)

                with pytest.raises(TransientError):
                    await feed.subscribe("scan", "job-2")

                assert feed.channels == 1
                back = await served_once_back(feed, pubsub_server, "job-3")
                assert await seqs(back, 1) == [1]

        run_on(loop, scenario())
