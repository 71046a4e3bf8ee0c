"""Pub/Sub through Redis Sentinel: the Broadcaster and EventFeed contracts on the master the
sentinels name, and a viewer's feed following a failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.redis.connections.connection import open_redis
from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.adapters.redis.router.broadcaster import RedisPubSubBroadcaster
from eco_router.application.feed_health import FeedHealth
from eco_router.application.port_values import FeedGap
from eco_router.testing import SentinelGroup
from tests.contracts.factories import encoded, entry_id

# The module, not its classes: a test class imported by name would be collected here again.
from tests.integration import test_contracts_redis as on_one_server
from tests.integration.topology_fixtures import Shared


@pytest.fixture
async def master(sentinel_group: SentinelGroup) -> AsyncIterator[Redis]:
    """A client of the group's master, found through the sentinels."""
    async with open_redis(sentinel_group.url, socket_timeout_s=5.0, client_name="t") as client:
        assert isinstance(client, Redis)
        yield client


class _CutGroup:
    """Stops every data node of the group (the tests that cut the server), for good."""

    def __init__(self, group: SentinelGroup, shared: Shared[SentinelGroup]) -> None:
        self._group = group
        self._shared = shared

    def stop(self) -> None:
        self._shared.broken = True
        for server in self._group.servers:
            server.stop()


class TestBroadcasterThroughSentinel(on_one_server.TestRedisPubSubBroadcaster):
    @pytest.fixture(autouse=True)
    async def _backend(  # type: ignore[override]
        self, sentinel_group: SentinelGroup, shared_sentinel: Shared[SentinelGroup], master: Redis
    ) -> AsyncIterator[None]:
        self.server = _CutGroup(sentinel_group, shared_sentinel)  # type: ignore[assignment]
        self.redis = master
        self.subscriptions: list[PubSub] = []
        yield
        for pubsub in self.subscriptions:
            await pubsub.aclose()


class TestEventFeedThroughSentinel(on_one_server.TestRedisPubSubEventFeed):
    @pytest.fixture(autouse=True)
    async def _backend(self, master: Redis) -> AsyncIterator[None]:  # type: ignore[override]
        self.redis = master
        self.feeds: list[RedisPubSubEventFeed] = []
        yield
        for feed in self.feeds:
            await feed.stop()


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
            await broadcaster.broadcast([encoded(job_id="job-1", seq=1)])
            assert getattr(await viewer.next(5.0), "event_id", None) == 1

            shared_sentinel.broken = True
            old = sentinel_group.kill_master()
            await asyncio.to_thread(sentinel_group.wait_for_new_master, old)

            assert isinstance(await viewer.next(15.0), FeedGap)
            async with asyncio.timeout(15):
                while True:
                    try:
                        await broadcaster.broadcast(
                            [encoded(job_id="job-1", seq=2, stream_id=entry_id(2))]
                        )
                        break
                    except Exception:
                        await asyncio.sleep(0.2)
            assert getattr(await viewer.next(5.0), "event_id", None) == 2
            assert health.checks() == {"feed": "ok"}
            await viewer.close()
        finally:
            await feed.stop()
