"""Publishing job-progress events from a worker: the public producer API.

    from eco_router.producer import connect, producer_config

    publisher = connect("redis://localhost:6379/0", producer_config(domain="scan", shards=4))
    entry_id = publisher.publish_stage_event("job-42", "vision", "completed", progress=25)

`connect_async` gives the same for asyncio code; without a URL both write to the Redis the
`eco-router` commands would find (`streams_url`: the environment's, else `make run`'s). Both
are thin shells around one core (`adapters/producer_core.py`): the rules below hold for
either. Calls are validated before Redis is touched (`InvalidProgressEvent`), the seq is
deterministic, and a repeated call within the idempotency window returns the first entry's
id instead of adding another.

A chat answer goes out as tokens while the model writes it: `str` deltas or OpenAI-style
chunks, merged within `coalesce_ms`, each entry written once per (job, attempt, seq):

    publisher = connect_async(url, producer_config(domain="chat", shards=4))
    stream = await openai_client.chat.completions.create(..., stream=True)
    published = await publisher.publish_tokens(job_id, stream, node="answer")
    await publisher.publish_stage_event(job_id, "answer", "completed", seq=161)

A retried task passes `attempt=1, 2, ...`: the router starts the job's text again.

A job's viewers may cancel it or answer its question (docs/CONTROL.md); the worker asks:

    if publisher.cancelled(job_id):                      # cheap enough between tokens
        publisher.publish_stage_event(job_id, "done", "cancelled")
    message = publisher.next_control(job_id, timeout_s=300)   # e.g. after `needs_input`
    if message is not None:
        handle(message.body)
        publisher.acknowledge(message)                   # else it is handed again

Code written for the reference design keeps its call sites and its client; only the import
changes:

    from eco_router.producer import publish_stage_event

    publish_stage_event(redis_client, job_id, "vision", "completed", progress=25)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from eco_router.adapters.progress_entries import (
    DEFAULT_IDEMPOTENCY_TTL_S,
    DEFAULT_MAXLEN,
    ProducerConfig,
)
from eco_router.adapters.redis.connections.connection import async_redis_client, sync_redis_client
from eco_router.adapters.redis.connections.replica_wait import ReplicasBehind
from eco_router.adapters.redis.connections.topology import ClusterSeeds, parse_redis_url
from eco_router.adapters.redis.producer.publisher import AsyncStreamPublisher, StreamPublisher
from eco_router.adapters.redis.producer.publisher_cache import PublisherCache
from eco_router.domain.control import ControlKind, ControlMessage, ControlState
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.event_size import (
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    EventSizeLimits,
)
from eco_router.domain.progress import (
    DEFAULT_STAGES,
    InvalidProgressEvent,
    StageEvent,
    StagePlan,
    Status,
)
from eco_router.domain.streams import StreamFamily, shard_for
from eco_router.domain.token_entries import DEFAULT_COALESCE_MS, TokensPublished
from eco_router.entrypoints.discovery import (
    InMemoryServeOnly,
    choose_server,
    discovery_dir,
    live_records,
)

# Read at each call of `publish_stage_event`, never at import.
from eco_router.producer_variables import (
    DOMAIN_VARIABLE,
    REFERENCE_SHARDS_VARIABLE,
    SHARDS_VARIABLE,
)

__all__ = [
    "DEFAULT_COALESCE_MS",
    "FIRST_TOKEN_SEQ",
    "AsyncStreamPublisher",
    "ControlKind",
    "ControlMessage",
    "ControlState",
    "InMemoryServeOnly",
    "InvalidProgressEvent",
    "ProducerConfig",
    "ReplicasBehind",
    "StageEvent",
    "StagePlan",
    "Status",
    "StreamPublisher",
    "TokensPublished",
    "connect",
    "connect_async",
    "producer_config",
    "publish_stage_event",
    "publish_stage_event_async",
    "shard_for",
    "streams_url",
]

DEFAULT_DOMAIN = "scan"
DEFAULT_SHARDS = 4
MAX_SHARDS = 1024
_DOMAIN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


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


def connect(url: str | None = None, config: ProducerConfig | None = None) -> StreamPublisher:
    """A synchronous publisher on `url` (default config: domain `scan`, 4 shards).

    `url` names one server (`redis://`), a Sentinel group (`redis+sentinel://`) or a Redis
    Cluster (`redis+cluster://`), as the routers' `REDIS_STREAMS_URL` does; on a cluster the
    shards are hash-tagged, as the routers read them there. Behind Sentinel, the publisher
    leaves the old master as soon as the sentinels announce a failover. Without `url`, the
    server is found as the `eco-router` commands find it (`streams_url`).
    """
    url = streams_url() if url is None else url
    return StreamPublisher(sync_redis_client(url), laid_out(config or producer_config(), url))


def connect_async(
    url: str | None = None, config: ProducerConfig | None = None
) -> AsyncStreamPublisher:
    """An asyncio publisher on `url`, as `connect` gives a synchronous one."""
    url = streams_url() if url is None else url
    return AsyncStreamPublisher(async_redis_client(url), laid_out(config or producer_config(), url))


def streams_url() -> str:
    """The streams server a publisher without a URL writes to, as the `eco-router` commands
    choose it: `REDIS_STREAMS_URL` (or `EVENT_ROUTER_REDIS_STREAMS_URL`) when set; else the
    Redis of the newest running `serve --embedded-redis` (`make run`); else
    `redis://localhost:6379/0`. Raises `InMemoryServeOnly` when the only `serve` running
    keeps its streams in memory, where no other process can write."""
    return choose_server(os.environ, live_records(discovery_dir())).streams_url


def laid_out(config: ProducerConfig, url: str) -> ProducerConfig:
    """`config` with tagged shards on a Redis Cluster (`EVENT_ROUTER_KEY_LAYOUT=auto`)."""
    if config.family.tagged or not isinstance(parse_redis_url(url), ClusterSeeds):
        return config
    return dataclasses.replace(config, family=dataclasses.replace(config.family, tagged=True))


SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

_sync_publishers: PublisherCache[SyncClient, StreamPublisher] = PublisherCache(
    "publishers", StreamPublisher
)
_async_publishers: PublisherCache[AsyncClient, AsyncStreamPublisher] = PublisherCache(
    "async_publishers", AsyncStreamPublisher
)


def publish_stage_event(
    redis_client: SyncClient,
    job_id: str,
    stage: str,
    status: str,
    result: Any = None,
    progress: int | None = None,
    *,
    seq: int | None = None,
    domain: str | None = None,
    shards: int | None = None,
    config: ProducerConfig | None = None,
) -> str:
    """Publish one event on the caller's own client (`redis.Redis` or `RedisCluster`) and
    return its entry id: the reference design's call, with the SDK's shards, seqs,
    idempotency and validation.

    The layout is `config`, else `domain` and `shards`, else `EVENT_ROUTER_PRODUCER_DOMAIN`
    and `EVENT_ROUTER_PRODUCER_SHARDS` (`SSE_SHARD_COUNT`, the reference design's name, when
    that is unset), else `scan` and 4. A Redis Cluster client gets tagged shards, as the
    routers read them there. A bad setting raises `ValueError` naming it.
    """
    chosen = _chosen_config(
        config, domain, shards, cluster=isinstance(redis_client, redis.cluster.RedisCluster)
    )
    event = StageEvent(job_id, stage, status, result, progress, seq)
    return _sync_publishers.get(redis_client, chosen).publish(event)


async def publish_stage_event_async(
    redis_client: AsyncClient,
    job_id: str,
    stage: str,
    status: str,
    result: Any = None,
    progress: int | None = None,
    *,
    seq: int | None = None,
    domain: str | None = None,
    shards: int | None = None,
    config: ProducerConfig | None = None,
) -> str:
    """`publish_stage_event` on a `redis.asyncio` client (`Redis` or `RedisCluster`)."""
    chosen = _chosen_config(
        config,
        domain,
        shards,
        cluster=isinstance(redis_client, redis.asyncio.cluster.RedisCluster),
    )
    event = StageEvent(job_id, stage, status, result, progress, seq)
    return await _async_publishers.get(redis_client, chosen).publish(event)


def _chosen_config(
    config: ProducerConfig | None,
    domain: str | None,
    shards: int | None,
    *,
    cluster: bool,
) -> ProducerConfig:
    if config is not None:
        if domain is not None or shards is not None:
            raise ValueError("pass either config or domain/shards, not both")
        if cluster and not config.family.tagged:
            return dataclasses.replace(
                config, family=dataclasses.replace(config.family, tagged=True)
            )
        return config
    env = os.environ
    where = "domain"
    if domain is None:
        domain = _setting(env, DOMAIN_VARIABLE)
        where = DOMAIN_VARIABLE if domain else where
        domain = domain or DEFAULT_DOMAIN
    if not isinstance(domain, str) or _DOMAIN.fullmatch(domain) is None:
        raise ValueError(f"{where}={domain!r} must be 1-64 characters of [A-Za-z0-9_.-]")
    if shards is None:
        shards = _shards_from(env)
    elif isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards={shards!r} must be an integer from 1 to {MAX_SHARDS}")
    return _layout(domain, shards, cluster)


def _shards_from(env: Mapping[str, str]) -> int:
    for name in (SHARDS_VARIABLE, REFERENCE_SHARDS_VARIABLE):
        text = _setting(env, name)
        if not text:
            continue
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_SHARDS:
            raise ValueError(f"{name}={text!r} must be an integer from 1 to {MAX_SHARDS}")
        return int(text)
    return DEFAULT_SHARDS


def _setting(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip()


@functools.cache
def _layout(domain: str, shards: int, tagged: bool) -> ProducerConfig:
    """Built once per layout, not at each call."""
    return producer_config(domain=domain, shards=shards, tagged=tagged)
