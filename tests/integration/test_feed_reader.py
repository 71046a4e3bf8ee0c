"""The gateway's Pub/Sub reader outlives errors that are not about the connection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.adapters.redis.router.broadcaster import RedisPubSubBroadcaster
from eco_router.application.errors import TransientError
from eco_router.application.feed_health import FeedHealth
from eco_router.testing import RedisServer
from tests.contracts.event_feed import seqs
from tests.contracts.factories import encoded, wait_until

pytestmark = pytest.mark.integration

PREFIX = "sse:feed-reader"


@pytest.fixture
def health() -> FeedHealth:
    return FeedHealth()


@pytest.fixture
def metrics() -> InMemoryGatewayMetrics:
    return InMemoryGatewayMetrics()


@pytest.fixture
async def feed(
    pubsub_server: RedisServer, health: FeedHealth, metrics: InMemoryGatewayMetrics
) -> AsyncIterator[RedisPubSubEventFeed]:
    """A feed whose user may subscribe to the channels of `allowed-*` jobs only."""
    admin = Redis.from_url(pubsub_server.url)
    await admin.execute_command(
        "ACL", "SETUSER", "gateway", "on", ">secret", "~*", "+@all",
        "resetchannels", f"&{PREFIX}:allowed-*",
    )  # fmt: skip
    redis = Redis.from_url(f"redis://gateway:secret@127.0.0.1:{pubsub_server.port}/0")
    feed = RedisPubSubEventFeed(
        redis,
        channel_prefix=PREFIX,
        decoder=OrjsonEventDecoder(),
        metrics=metrics,
        confirm_timeout_s=2.0,
        health=health,
    )
    await feed.start()
    yield feed
    await feed.stop()
    await redis.aclose()
    await admin.execute_command("ACL", "DELUSER", "gateway")
    await admin.aclose()


class TestARefusedSubscription:
    async def test_fails_its_viewer_and_the_next_viewers_are_served(
        self,
        feed: RedisPubSubEventFeed,
        pubsub_redis: Redis,
        health: FeedHealth,
        metrics: InMemoryGatewayMetrics,
    ) -> None:
        with pytest.raises(TransientError, match="permissions"):
            await feed.subscribe("scan", "refused-1")
        refused = health.checks()["feed"]
        failing = metrics.feed_failing

        viewer = await feed.subscribe("scan", "allowed-1")
        broadcaster = RedisPubSubBroadcaster(pubsub_redis, channel_prefix=PREFIX)
        await broadcaster.broadcast([encoded(job_id="allowed-1", seq=1)])

        assert await seqs(viewer, 1) == [1]
        assert "permissions" in refused
        assert metrics.feed_failures == 1
        await wait_until(_ok(health), what="the feed check back to ok")
        assert failing
        assert not metrics.feed_failing


def _ok(health: FeedHealth) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return health.checks() == {"feed": "ok"}

    return probe
