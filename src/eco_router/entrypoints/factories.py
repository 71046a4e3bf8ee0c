"""Small factories the container wires: connections with a lifecycle and chosen adapters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict

from pydantic import SecretStr
from redis.asyncio.cluster import RedisCluster

from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer, OpenAdminAuthorizer
from eco_router.adapters.jwt_authorizer import JwtAuthorizer, OpenAuthorizer
from eco_router.adapters.jwt_secret import MAX_TOKEN_BYTES
from eco_router.adapters.progress_entries import ProducerConfig
from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.adapters.redis.gateway.sharded_event_feed import RedisShardedPubSubEventFeed
from eco_router.adapters.redis.router.broadcaster import (
    RedisPubSubBroadcaster,
    RedisShardedPubSubBroadcaster,
)
from eco_router.application.feed_health import FeedHealth
from eco_router.application.ports import (
    AdminAuthorizer,
    Authorizer,
    Broadcaster,
    EventDecoder,
    EventFeed,
    GatewayMetrics,
)
from eco_router.entrypoints.settings import Settings


def demo_producer_config(settings: Settings) -> ProducerConfig:
    """Demo jobs go to the first configured family."""
    return ProducerConfig(
        family=settings.streams[0],
        size_limits=settings.event_size_limits,
        max_field_bytes=settings.max_field_bytes,
    )


def demo_chat_producer_config(settings: Settings) -> ProducerConfig:
    """Demo chat jobs go to the `chat` family, else to the first one (their seqs are their own)."""
    family = next((f for f in settings.streams if f.domain == "chat"), settings.streams[0])
    return ProducerConfig(
        family=family,
        size_limits=settings.event_size_limits,
        max_field_bytes=settings.max_field_bytes,
    )


def make_authorizer(
    secret: SecretStr | None, require_exp: bool = True, max_token_bytes: int = MAX_TOKEN_BYTES
) -> Authorizer:
    """JWTs when a secret is configured, else open (the app warns at startup)."""
    if secret is None:
        return OpenAuthorizer()
    return JwtAuthorizer(
        secret.get_secret_value(), require_exp=require_exp, max_token_bytes=max_token_bytes
    )


def make_admin_authorizer(
    secret: SecretStr | None, max_token_bytes: int = MAX_TOKEN_BYTES
) -> AdminAuthorizer:
    """Admin JWTs when a secret is configured, else open (the console warns at startup)."""
    if secret is None:
        return OpenAdminAuthorizer()
    return JwtAdminAuthorizer(secret.get_secret_value(), max_token_bytes=max_token_bytes)


def make_broadcaster(redis: RedisClient, *, channel_prefix: str) -> Broadcaster:
    """SPUBLISH on a Redis Cluster (a message goes to its channel's node only), else PUBLISH."""
    if isinstance(redis, RedisCluster):
        return RedisShardedPubSubBroadcaster(redis, channel_prefix=channel_prefix)
    return RedisPubSubBroadcaster(redis, channel_prefix=channel_prefix)


class _FeedOptions(TypedDict):
    channel_prefix: str
    decoder: EventDecoder
    metrics: GatewayMetrics
    queue_size: int
    health: FeedHealth


@asynccontextmanager
async def open_event_feed(
    redis: RedisClient,
    *,
    channel_prefix: str,
    decoder: EventDecoder,
    metrics: GatewayMetrics,
    queue_size: int,
    health: FeedHealth,
) -> AsyncIterator[EventFeed]:
    """The process's one Pub/Sub feed (sharded on a Redis Cluster), its readers running
    while the app runs."""
    options = _FeedOptions(
        channel_prefix=channel_prefix,
        decoder=decoder,
        metrics=metrics,
        queue_size=queue_size,
        health=health,
    )
    feed: RedisPubSubEventFeed | RedisShardedPubSubEventFeed
    if isinstance(redis, RedisCluster):
        feed = RedisShardedPubSubEventFeed(redis, **options)
    else:
        feed = RedisPubSubEventFeed(redis, **options)
    await feed.start()
    try:
        yield feed
    finally:
        await feed.stop()
