"""Pub/Sub through Redis Sentinel: the Broadcaster and EventFeed contracts on the master the
sentinels name, and a viewer's feed following a failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.redis.broadcaster import RedisPubSubBroadcaster
from eco_router.adapters.redis.connection import open_redis
from eco_router.adapters.redis.event_feed import RedisPubSubEventFeed
from eco_router.application.feed_health import FeedHealth
from eco_router.application.messages import FeedGap
from eco_router.application.ports import Broadcaster, EventFeed, GatewayMetrics
from eco_router.testing import SentinelGroup
from tests.contracts.broadcaster import PREFIX, BroadcasterContract, Receive
from tests.contracts.event_feed import PREFIX as FEED_PREFIX
from tests.contracts.event_feed import EventFeedContract
from tests.contracts.factories import encoded, entry_id
from tests.integration.topology_fixtures import Shared


@pytest.fixture
async def master(sentinel_group: SentinelGroup) -> AsyncIterator[Redis]:
    """A client of the group's master, found through the sentinels."""
    async with open_redis(sentinel_group.url, socket_timeout_s=5.0, client_name="t") as client:
        assert isinstance(client, Redis)
        yield client


class TestBroadcasterThroughSentinel(BroadcasterContract):
    @pytest.fixture(autouse=True)
    async def _backend(
        self, sentinel_group: SentinelGroup, shared_sentinel: Shared[SentinelGroup], master: Redis
    ) -> AsyncIterator[None]:
        self.group = sentinel_group
        self.shared = shared_sentinel
        self.redis = master
        self.pubsubs: list[PubSub] = []
        yield
        for pubsub in self.pubsubs:
            await pubsub.aclose()

    async def make_broadcaster(self) -> Broadcaster:
        return RedisPubSubBroadcaster(self.redis, channel_prefix=PREFIX)

    async def subscribe(self, broadcaster: Broadcaster, channel: str) -> Receive:
        pubsub = self.redis.pubsub()
        self.pubsubs.append(pubsub)
        await pubsub.subscribe(channel)
        assert (await _next_message(pubsub))["type"] == "subscribe"

        async def receive() -> bytes:
            message = await _next_message(pubsub)
            assert message["type"] == "message"
            data = message["data"]
            assert isinstance(data, bytes)
            return data

        return receive

    async def cut_server(self, broadcaster: Broadcaster) -> None:
        self.shared.broken = True
        for server in self.group.servers:
            server.stop()


async def _next_message(pubsub: PubSub) -> dict[str, Any]:
    async with asyncio.timeout(5):
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is not None:
                return dict(message)


class TestEventFeedThroughSentinel(EventFeedContract):
    @pytest.fixture(autouse=True)
    async def _backend(self, master: Redis) -> AsyncIterator[None]:
        self.redis = master
        self.feeds: list[RedisPubSubEventFeed] = []
        yield
        for feed in self.feeds:
            await feed.stop()

    async def make_feed(
        self, *, metrics: GatewayMetrics, queue_size: int = 256
    ) -> tuple[EventFeed, Broadcaster]:
        feed = RedisPubSubEventFeed(
            self.redis,
            channel_prefix=FEED_PREFIX,
            decoder=OrjsonEventDecoder(),
            metrics=metrics,
            queue_size=queue_size,
        )
        await feed.start()
        self.feeds.append(feed)
        return feed, RedisPubSubBroadcaster(self.redis, channel_prefix=FEED_PREFIX)


class TestFailover:
    async def test_a_viewer_gets_a_gap_notice_and_later_events_after_the_master_fails_over(
        self, sentinel_group: SentinelGroup, shared_sentinel: Shared[SentinelGroup], master: Redis
    ) -> None:
        health = FeedHealth()
        feed = RedisPubSubEventFeed(
            master,
            channel_prefix="sse:events",
            decoder=OrjsonEventDecoder(),
            metrics=InMemoryGatewayMetrics(),
            health=health,
        )
        await feed.start()
        broadcaster = RedisPubSubBroadcaster(master, channel_prefix="sse:events")
        try:
            viewer = await feed.subscribe("scan", "job-1")
            await broadcaster.publish([encoded(job_id="job-1", seq=1)])
            assert getattr(await viewer.next(5.0), "seq", None) == 1

            shared_sentinel.broken = True
            old = sentinel_group.kill_master()
            await asyncio.to_thread(sentinel_group.wait_for_new_master, old)

            assert isinstance(await viewer.next(15.0), FeedGap)
            async with asyncio.timeout(15):
                while True:
                    try:
                        await broadcaster.publish(
                            [encoded(job_id="job-1", seq=2, stream_id=entry_id(2))]
                        )
                        break
                    except Exception:
                        await asyncio.sleep(0.2)
            assert getattr(await viewer.next(5.0), "seq", None) == 2
            assert health.checks() == {"feed": "ok"}
            await viewer.close()
        finally:
            await feed.stop()
