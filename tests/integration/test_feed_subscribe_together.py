"""Viewers joining the gateway's Pub/Sub feed together share one SUBSCRIBE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.adapters.redis.router.broadcaster import RedisPubSubBroadcaster
from eco_router.application.ports import FeedSubscription
from tests.contracts.event_feed import seqs
from tests.contracts.factories import encoded

pytestmark = pytest.mark.integration

PREFIX = "sse:together"
JOBS = [f"job-{n}" for n in range(200)]


@pytest.fixture
async def feed(pubsub_redis: Redis) -> AsyncIterator[RedisPubSubEventFeed]:
    feed = RedisPubSubEventFeed(
        pubsub_redis,
        channel_prefix=PREFIX,
        decoder=OrjsonEventDecoder(),
        metrics=InMemoryGatewayMetrics(),
        confirm_timeout_s=5.0,
    )
    await feed.start()
    yield feed
    await feed.stop()


async def subscribe_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_subscribe", {}).get("calls", 0))


async def test_a_burst_of_viewers_is_subscribed_in_a_few_commands_and_each_gets_its_events(
    feed: RedisPubSubEventFeed, pubsub_redis: Redis
) -> None:
    viewers = await asyncio.gather(*(feed.subscribe("scan", job) for job in JOBS))
    await RedisPubSubBroadcaster(pubsub_redis, channel_prefix=PREFIX).broadcast(
        [encoded(job_id=job, seq=1) for job in JOBS]
    )

    assert [await seqs(viewer, 1) for viewer in viewers] == [[1]] * len(JOBS)
    assert await subscribe_calls(pubsub_redis) <= 5
    assert feed.channels == len(JOBS)


async def test_a_viewer_giving_up_while_its_subscription_is_on_its_way_costs_the_others_nothing(
    feed: RedisPubSubEventFeed, pubsub_redis: Redis
) -> None:
    tasks = [asyncio.ensure_future(feed.subscribe("scan", job)) for job in JOBS[:50]]
    await asyncio.sleep(0)
    tasks[0].cancel()

    done = await asyncio.gather(*tasks, return_exceptions=True)
    viewers = [v for v in done[1:] if isinstance(v, FeedSubscription)]
    await RedisPubSubBroadcaster(pubsub_redis, channel_prefix=PREFIX).broadcast(
        [encoded(job_id=job, seq=1) for job in JOBS[1:50]]
    )

    assert isinstance(done[0], asyncio.CancelledError)
    assert len(viewers) == 49
    assert [await seqs(viewer, 1) for viewer in viewers] == [[1]] * 49
    assert feed.channels == 49
