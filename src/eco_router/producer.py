"""Publishing job-progress events from a worker: the public producer API.

    from eco_router.producer import connect, producer_config

    publisher = connect("redis://localhost:6379/0", producer_config(domain="scan", shards=4))
    entry_id = publisher.publish_stage_event("job-42", "vision", "completed", progress=25)

`connect_async` gives the same for asyncio code. Calls are validated before Redis is touched
(`InvalidProgressEvent`), the seq is deterministic, and a repeated call within the
idempotency window returns the first entry's id instead of adding another.
"""

from __future__ import annotations

import dataclasses

from eco_router.adapters.progress_entries import (
    DEFAULT_IDEMPOTENCY_TTL_S,
    DEFAULT_MAXLEN,
    ProducerConfig,
)
from eco_router.adapters.redis.connection import async_redis_client, sync_redis_client
from eco_router.adapters.redis.publisher import AsyncStreamPublisher, StreamPublisher
from eco_router.adapters.redis.replica_wait import ReplicasBehind
from eco_router.adapters.redis.topology import ClusterSeeds, parse_redis_url
from eco_router.domain.event_size import (
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    EventSizeLimits,
)
from eco_router.domain.progress import DEFAULT_STAGES, InvalidProgressEvent, StagePlan, Status
from eco_router.domain.streams import StreamFamily, shard_for

__all__ = [
    "AsyncStreamPublisher",
    "InvalidProgressEvent",
    "ProducerConfig",
    "ReplicasBehind",
    "StagePlan",
    "Status",
    "StreamPublisher",
    "connect",
    "connect_async",
    "producer_config",
    "shard_for",
]


def producer_config(
    *,
    domain: str = "scan",
    shards: int = 4,
    tagged: bool = False,
    stages: tuple[str, ...] = DEFAULT_STAGES,
    idempotency_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_S,
    maxlen: int = DEFAULT_MAXLEN,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    wait_replicas: int = 0,
    wait_timeout_ms: int = 500,
) -> ProducerConfig:
    """Settings for the `{domain}:events:{shard}` streams the router reads; the size limits
    must match the routers' `EVENT_ROUTER_MAX_EVENT_BYTES` and `..._MAX_RESULT_BYTES`;
    `tagged` matches `EVENT_ROUTER_KEY_LAYOUT=tagged` (a cluster URL implies it).

    `wait_replicas` > 0: a call returns only once that many replicas have the entry, so a
    failover right after it cannot lose it; fewer within `wait_timeout_ms` raise
    `ReplicasBehind` (the entry is written: calling again returns the same id)."""
    if shards < 1:
        raise ValueError("shards must be at least 1")
    if wait_replicas < 0 or wait_timeout_ms < 0:
        raise ValueError("wait_replicas and wait_timeout_ms must not be negative")
    return ProducerConfig(
        family=StreamFamily(f"{domain}:events", shards, tagged),
        plan=StagePlan(tuple(stages)),
        idempotency_ttl_s=idempotency_ttl_s,
        maxlen=maxlen,
        size_limits=EventSizeLimits(max_event_bytes, max_result_bytes),
        wait_replicas=wait_replicas,
        wait_timeout_ms=wait_timeout_ms,
    )


def connect(
    url: str = "redis://localhost:6379/0", config: ProducerConfig | None = None
) -> StreamPublisher:
    """A synchronous publisher on `url` (default config: domain `scan`, 4 shards).

    `url` names one server (`redis://`), a Sentinel group (`redis+sentinel://`) or a Redis
    Cluster (`redis+cluster://`), as the routers' `REDIS_STREAMS_URL` does; on a cluster the
    shards are hash-tagged, as the routers read them there.
    """
    return StreamPublisher(sync_redis_client(url), laid_out(config or producer_config(), url))


def connect_async(
    url: str = "redis://localhost:6379/0", config: ProducerConfig | None = None
) -> AsyncStreamPublisher:
    """An asyncio publisher on `url`, as `connect` gives a synchronous one."""
    return AsyncStreamPublisher(async_redis_client(url), laid_out(config or producer_config(), url))


def laid_out(config: ProducerConfig, url: str) -> ProducerConfig:
    """`config` with tagged shards on a Redis Cluster (`EVENT_ROUTER_KEY_LAYOUT=auto`)."""
    if config.family.tagged or not isinstance(parse_redis_url(url), ClusterSeeds):
        return config
    return dataclasses.replace(config, family=dataclasses.replace(config.family, tagged=True))
