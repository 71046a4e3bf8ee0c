"""Viewers leaving while the gateway stops: every leave ends cleanly, nothing is left unretrieved.

Clients that disconnect at once (thousands, as when a load balancer drops them) leave their
channels from their own tasks while SIGTERM stops the feed and closes its connection; an
unsubscribe then must not fail on the closing connection.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.redis.connections.connection import RedisClient, open_redis
from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.adapters.redis.gateway.sharded_event_feed import RedisShardedPubSubEventFeed
from eco_router.application.ports import EventFeed, FeedSubscription
from eco_router.testing import ClusterGroup, RedisServer

pytestmark = pytest.mark.integration

VIEWERS = 400
ROUNDS = 5
# When stop() comes: before the first unsubscribe is sent, among them, after most.
DELAYS_S = [0.0, 0.005, 0.02]


async def _round(url: str, delay_s: float) -> tuple[list[BaseException], list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    async with open_redis(url, socket_timeout_s=5.0, client_name="test") as redis:
        feed = _feed(redis)
        await feed.start()
        viewers: list[FeedSubscription] = [
            await feed.subscribe("scan", f"job-{n}") for n in range(VIEWERS)
        ]
        feed.close_viewers()
        leaving = [asyncio.create_task(v.close()) for v in viewers]
        await asyncio.sleep(delay_s)
        await feed.stop()
        results = await asyncio.gather(*leaving, return_exceptions=True)
    del leaving
    gc.collect()  # an unretrieved task exception is reported when the task is collected
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    return [r for r in results if isinstance(r, BaseException)], unhandled


def _feed(redis: RedisClient) -> EventFeed:
    common: dict[str, Any] = {
        "channel_prefix": "sse:shutdown",
        "decoder": OrjsonEventDecoder(),
        "metrics": InMemoryGatewayMetrics(),
    }
    if isinstance(redis, RedisCluster):
        return RedisShardedPubSubEventFeed(redis, **common)
    return RedisPubSubEventFeed(redis, **common)


@pytest.fixture(params=["one server", "cluster"])
def pubsub_url(request: pytest.FixtureRequest) -> str:
    """Plain Pub/Sub on one server, sharded Pub/Sub on a cluster."""
    if request.param == "cluster":
        cluster: ClusterGroup = request.getfixturevalue("redis_cluster")
        return cluster.url
    server: RedisServer = request.getfixturevalue("pubsub_server")
    return server.url


@pytest.mark.parametrize("delay_s", DELAYS_S)
async def test_viewers_leaving_during_stop_end_cleanly(pubsub_url: str, delay_s: float) -> None:
    for _ in range(ROUNDS):
        failed, unhandled = await _round(pubsub_url, delay_s)

        assert failed == []
        assert unhandled == []
