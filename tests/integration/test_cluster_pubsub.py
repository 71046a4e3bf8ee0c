"""Sharded Pub/Sub on a real Redis Cluster: the Broadcaster and EventFeed contracts, channels
spread over the nodes, and a viewer's feed surviving its node's failover."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.redis.connections.connection import open_redis
from eco_router.adapters.redis.gateway.sharded_event_feed import RedisShardedPubSubEventFeed
from eco_router.adapters.redis.router.broadcaster import RedisShardedPubSubBroadcaster
from eco_router.application.feed_health import FeedHealth
from eco_router.application.port_values import FeedGap
from eco_router.application.ports import Broadcaster, EventFeed, GatewayMetrics
from eco_router.domain.sse import GatewayEvent
from eco_router.domain.streams import key_slot
from eco_router.testing import ClusterGroup, resp
from tests.contracts.broadcaster import PREFIX, BroadcasterContract, Receive
from tests.contracts.event_feed import PREFIX as FEED_PREFIX
from tests.contracts.event_feed import EventFeedContract
from tests.contracts.factories import encoded, entry_id
from tests.integration.topology_fixtures import Shared


@pytest.fixture
async def cluster_client(redis_cluster: ClusterGroup) -> AsyncIterator[RedisCluster]:
    async with open_redis(redis_cluster.url, socket_timeout_s=5.0, client_name="test") as client:
        assert isinstance(client, RedisCluster)
        yield client


class TestShardedBroadcaster(BroadcasterContract):
    @pytest.fixture(autouse=True)
    async def _backend(
        self,
        redis_cluster: ClusterGroup,
        shared_cluster: Shared[ClusterGroup],
        cluster_client: RedisCluster,
    ) -> AsyncIterator[None]:
        self.cluster = redis_cluster
        self.shared = shared_cluster
        self.redis = cluster_client
        self.pubsubs: list[Any] = []
        yield
        for pubsub in self.pubsubs:
            await pubsub.aclose()

    async def make_broadcaster(self) -> Broadcaster:
        return RedisShardedPubSubBroadcaster(self.redis, channel_prefix=PREFIX)

    async def subscribe(self, broadcaster: Broadcaster, channel: str) -> Receive:
        node = self.redis.get_node_from_key(channel)
        assert node is not None
        pubsub = self.redis.pubsub(node=node)
        self.pubsubs.append(pubsub)
        await pubsub.ssubscribe(channel)
        confirmation = await _next_message(pubsub, node)
        assert confirmation["type"] == "ssubscribe"

        async def receive() -> bytes:
            message = await _next_message(pubsub, node)
            assert message["type"] == "smessage"
            assert message["channel"] == channel.encode()
            data = message["data"]
            assert isinstance(data, bytes)
            return data

        return receive

    async def cut_server(self, broadcaster: Broadcaster) -> None:
        self.shared.broken = True
        self.cluster.stop()


async def _next_message(pubsub: Any, node: ClusterNode) -> dict[str, Any]:
    async with asyncio.timeout(5):
        while True:
            message = await pubsub.get_sharded_message(timeout=1.0, target_node=node)
            if message is not None:
                return dict(message)


class TestShardedEventFeed(EventFeedContract):
    @pytest.fixture(autouse=True)
    async def _backend(self, cluster_client: RedisCluster) -> AsyncIterator[None]:
        self.redis = cluster_client
        self.feeds: list[RedisShardedPubSubEventFeed] = []
        yield
        for feed in self.feeds:
            await feed.stop()

    async def make_feed(
        self, *, metrics: GatewayMetrics, queue_size: int = 256
    ) -> tuple[EventFeed, Broadcaster]:
        feed = RedisShardedPubSubEventFeed(
            self.redis,
            channel_prefix=FEED_PREFIX,
            decoder=OrjsonEventDecoder(),
            metrics=metrics,
            queue_size=queue_size,
        )
        await feed.start()
        self.feeds.append(feed)
        return feed, RedisShardedPubSubBroadcaster(self.redis, channel_prefix=FEED_PREFIX)


class TestChannelPlacement:
    def test_ten_thousand_jobs_channels_spread_within_20_percent_over_three_masters(
        self, redis_cluster: ClusterGroup
    ) -> None:
        masters = redis_cluster.masters()
        per_master = Counter(
            next(m.master.port for m in masters if m.serves(key_slot(f"sse:events:job-{n}")))
            for n in range(10_000)
        )

        mean = 10_000 / len(masters)
        assert len(per_master) == 3
        assert all(abs(count - mean) <= 0.2 * mean for count in per_master.values()), per_master

    async def test_the_feed_keeps_one_connection_per_node_not_per_job(
        self, cluster_client: RedisCluster
    ) -> None:
        feed = RedisShardedPubSubEventFeed(
            cluster_client,
            channel_prefix="sse:events",
            decoder=OrjsonEventDecoder(),
            metrics=InMemoryGatewayMetrics(),
        )
        await feed.start()
        try:
            viewers = [await feed.subscribe("scan", f"job-{n}") for n in range(60)]
            clients = await cluster_client.client_list(target_nodes=RedisCluster.PRIMARIES)
            subscribed = [c for c in _flatten(clients) if int(c.get("ssub", 0)) > 0]
            assert len(subscribed) == 3
            assert sum(int(c["ssub"]) for c in subscribed) == 60
            for viewer in viewers:
                await viewer.close()
        finally:
            await feed.stop()


def _flatten(replies: Any) -> list[dict[str, Any]]:
    if isinstance(replies, dict):
        return [c for value in replies.values() for c in value]
    return list(replies)


@asynccontextmanager
async def sharded_feed(
    cluster: ClusterGroup, health: FeedHealth
) -> AsyncIterator[tuple[RedisShardedPubSubEventFeed, Broadcaster]]:
    """A running sharded feed on the cluster, and a broadcaster with its own client."""
    async with open_redis(cluster.url, socket_timeout_s=5.0, client_name="t") as redis:
        assert isinstance(redis, RedisCluster)
        feed = RedisShardedPubSubEventFeed(
            redis,
            channel_prefix="sse:events",
            decoder=OrjsonEventDecoder(),
            metrics=InMemoryGatewayMetrics(),
            health=health,
        )
        await feed.start()
        try:
            yield feed, RedisShardedPubSubBroadcaster(redis, channel_prefix="sse:events")
        finally:
            await feed.stop()


class TestFailover:
    async def test_a_viewer_gets_a_gap_notice_and_later_events_after_its_nodes_failover(
        self, redis_cluster: ClusterGroup, shared_cluster: Shared[ClusterGroup]
    ) -> None:
        health = FeedHealth()
        async with sharded_feed(redis_cluster, health) as (feed, broadcaster):
            viewer = await feed.subscribe("scan", "job-1")
            await broadcaster.broadcast([encoded(job_id="job-1", seq=1)])
            assert getattr(await viewer.next(5.0), "event_id", None) == 1

            shared_cluster.broken = True
            old = redis_cluster.master_for_slot(key_slot("sse:events:job-1"))
            redis_cluster.kill(old)
            await asyncio.to_thread(redis_cluster.wait_for_failover, old)

            assert isinstance(await viewer.next(15.0), FeedGap)
            await _publish_until_accepted(broadcaster, 2)
            assert getattr(await viewer.next(5.0), "event_id", None) == 2
            assert health.checks() == {"feed": "ok"}
            await viewer.close()


async def _publish_until_accepted(broadcaster: Broadcaster, seq: int) -> None:
    """The publisher's own client learns the new topology on its first failed command."""
    async with asyncio.timeout(15):
        while True:
            try:
                await broadcaster.broadcast(
                    [encoded(job_id="job-1", seq=seq, stream_id=entry_id(seq))]
                )
                return
            except Exception:
                await asyncio.sleep(0.2)


class TestMovedSlot:
    async def test_a_viewer_whose_channels_slot_moves_gets_a_gap_then_events_from_the_new_node(
        self, redis_cluster: ClusterGroup, shared_cluster: Shared[ClusterGroup]
    ) -> None:
        async with sharded_feed(redis_cluster, FeedHealth()) as (feed, broadcaster):
            viewer = await feed.subscribe("scan", "job-1")
            shared_cluster.broken = True
            _move_slot(redis_cluster, key_slot("sse:events:job-1"))

            assert isinstance(await viewer.next(10.0), FeedGap)
            async with asyncio.timeout(15):
                seq = 1
                while not isinstance(event := await viewer.next(0.2), GatewayEvent):
                    seq += 1
                    await _publish_until_accepted(broadcaster, seq)
            assert event.event_id == seq
            await viewer.close()


def _move_slot(cluster: ClusterGroup, slot: int) -> None:
    """Hand `slot` (holding no keys) from its master to another one, as a resharding does."""
    masters = cluster.masters()
    source = next(m for m in masters if m.serves(slot))
    target = next(m for m in masters if m is not source)
    resp.call(target.master.port, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", source.node_id)
    resp.call(source.master.port, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", target.node_id)
    for master in masters:
        resp.call(master.master.port, "CLUSTER", "SETSLOT", str(slot), "NODE", target.node_id)
