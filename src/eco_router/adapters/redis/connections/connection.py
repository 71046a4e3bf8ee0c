"""Opening and closing the Redis clients the adapters share, for every topology a URL names."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis
import redis.cluster
import redis.sentinel
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ResponseError

from eco_router.adapters.redis.connections.blocking_failover_watch import (
    WatchedBlockingSentinelConnection,
    WatchedBlockingSentinelSSLConnection,
    watch_failovers_blocking,
)
from eco_router.adapters.redis.connections.closed_writes import translate_closed_writes
from eco_router.adapters.redis.connections.command_packing import pack_commands_with_hiredis
from eco_router.adapters.redis.connections.failover_watch import (
    WatchedSentinelConnection,
    WatchedSentinelPoolMixin,
    WatchedSentinelSSLConnection,
    watch_failovers,
)
from eco_router.adapters.redis.connections.topology import (
    ClusterSeeds,
    Credentials,
    SentinelGroup,
    Standalone,
    parse_redis_url,
)

log = logging.getLogger(__name__)


# redis-py's default pool (capped at 100 in current releases) raises MaxConnectionsError past
# its cap: a burst of SSE clients, each reading its job's view, saw their streams end at once.
MAX_CONNECTIONS = 100
CONNECT_TIMEOUT_S = 2.0

# Called with each new connection in place of its handshake.
ConnectHook = Callable[[AbstractConnection], Awaitable[None]]

# What the adapters are given: one server's (or a Sentinel group's master's) client, or a
# Redis Cluster's, which routes each command to the node owning its keys' slot.
RedisClient = Redis | RedisCluster


class BlockingSentinelConnectionPool(
    WatchedSentinelPoolMixin, SentinelConnectionPool, BlockingConnectionPool
):
    """A Sentinel-managed pool that waits for a free connection past its cap, like the
    standalone one, instead of failing the command, and leaves the old master as soon as
    the sentinels announce a failover."""


class WatchedSentinelConnectionPool(WatchedSentinelPoolMixin, SentinelConnectionPool):
    """redis-py's Sentinel-managed pool, leaving the old master as soon as the sentinels
    announce a failover."""


def redis_client(
    url: str,
    *,
    socket_timeout_s: float,
    client_name: str,
    max_connections: int = MAX_CONNECTIONS,
    on_connect: ConnectHook | None = None,
) -> tuple[RedisClient, list[Redis]]:
    """A client for `url` (one server or a Sentinel group's master) that fails fast, and the
    sentinels' clients it asks (to close with it).

    Beyond `max_connections` concurrent commands, callers wait (up to the socket timeout)
    for a pooled connection instead of failing. Behind Sentinel, every new connection asks
    the sentinels for the master, so a failover needs no restart. `on_connect` replaces
    the handshake of every new connection (it calls `connection.on_connect()` itself).
    """
    pack_commands_with_hiredis()
    translate_closed_writes()
    topology = parse_redis_url(url)
    hook: dict[str, Any] = {"redis_connect_func": on_connect} if on_connect else {}
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": 15,
        # One quick retry swaps a pooled connection that died with a restarted server; longer
        # outages belong to the router's own back-off, which knows what to keep unacked.
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
        "client_name": client_name,
    }
    if isinstance(topology, Standalone):
        # TCP keepalive means nothing on a Unix socket, whose connection class refuses it.
        tcp = {} if url.startswith("unix://") else {"socket_keepalive": True}
        pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=socket_timeout_s, **common, **tcp, **hook
        )
        return Redis.from_pool(pool), []
    if isinstance(topology, SentinelGroup):
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            topology.sentinels, **_sentinel_group_kwargs(topology, socket_keepalive=True, **common)
        )
        client: Redis = sentinel.master_for(
            topology.master_name,
            redis_class=Redis,
            connection_pool_class=BlockingSentinelConnectionPool,
            connection_class=_watched_connection(topology),
            max_connections=max_connections,
            timeout=socket_timeout_s,
            **hook,
        )
        watch_failovers(client, list(sentinel.sentinels))
        return client, list(sentinel.sentinels)
    assert isinstance(topology, ClusterSeeds)
    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in topology.nodes],
        # A node's pool raises past its cap instead of waiting: leave room for bursts.
        max_connections=MAX_CONNECTIONS * 4,
        socket_keepalive=True,
        **{k: v for k, v in common.items() if k != "retry"},
        **_credential_kwargs(topology.credentials),
    )
    return cluster, []


def sync_redis_client(url: str) -> redis.Redis | redis.cluster.RedisCluster:
    """A blocking client for `url`, as the producer SDK's synchronous publisher uses it;
    behind Sentinel it leaves the old master as soon as a failover is announced."""
    topology = parse_redis_url(url)
    if isinstance(topology, Standalone):
        return redis.Redis.from_url(url)
    if isinstance(topology, SentinelGroup):
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            topology.sentinels, **_sentinel_group_kwargs(topology)
        )
        tls = topology.credentials.tls
        client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            topology.master_name,
            connection_class=WatchedBlockingSentinelSSLConnection
            if tls
            else WatchedBlockingSentinelConnection,
        )
        watch_failovers_blocking(client, list(sentinel.sentinels))
        return client
    return redis.cluster.RedisCluster(
        startup_nodes=[
            redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call]
            for h, p in topology.nodes
        ],
        **_credential_kwargs(topology.credentials),
    )


def async_redis_client(url: str) -> RedisClient:
    """An asyncio client for `url` with redis-py's defaults, for the producer SDK."""
    pack_commands_with_hiredis()
    translate_closed_writes()
    topology = parse_redis_url(url)
    if isinstance(topology, Standalone):
        return Redis.from_url(url)
    if isinstance(topology, SentinelGroup):
        sentinel = Sentinel(topology.sentinels, **_sentinel_group_kwargs(topology))  # type: ignore[no-untyped-call]
        client: Redis = sentinel.master_for(
            topology.master_name,
            redis_class=Redis,
            connection_pool_class=WatchedSentinelConnectionPool,
            connection_class=_watched_connection(topology),
        )
        watch_failovers(client, list(sentinel.sentinels))
        return client
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in topology.nodes],
        **_credential_kwargs(topology.credentials),
    )


def _watched_connection(topology: SentinelGroup) -> type[WatchedSentinelConnection]:
    tls = topology.credentials.tls
    return WatchedSentinelSSLConnection if tls else WatchedSentinelConnection


def _sentinel_group_kwargs(topology: SentinelGroup, **common: Any) -> dict[str, Any]:
    """`Sentinel(...)`'s keyword arguments: how to ask the sentinels, how to reach the master."""
    return {
        "sentinel_kwargs": _sentinel_kwargs(topology, socket_timeout_s=CONNECT_TIMEOUT_S),
        **common,
        **_credential_kwargs(topology.credentials),
        "db": topology.db,
    }


def _credential_kwargs(credentials: Credentials) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"username": credentials.username, "password": credentials.password}
    if credentials.tls:
        kwargs["ssl"] = True
        kwargs.update(credentials.tls_options)
    return kwargs


def _sentinel_kwargs(topology: SentinelGroup, *, socket_timeout_s: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        "username": topology.sentinel_username,
        "password": topology.sentinel_password,
    }
    if topology.sentinel_tls:
        kwargs["ssl"] = True
        kwargs.update(topology.credentials.tls_options)
    return kwargs


@asynccontextmanager
async def open_redis(
    url: str, *, socket_timeout_s: float, client_name: str, ping: bool = True
) -> AsyncIterator[RedisClient]:
    """A client that answered PING (fail fast at startup) and is closed on exit."""
    client, helpers = redis_client(url, socket_timeout_s=socket_timeout_s, client_name=client_name)
    try:
        if ping:
            await client.ping()
        yield client
    finally:
        await client.aclose()
        for helper in helpers:
            await helper.aclose()


class PinnedReader:
    """A client over one connection of its own, whose server-side id is known: a command
    blocking on it (XREADGROUP BLOCK) can be woken from another connection with CLIENT
    UNBLOCK, instead of being cancelled, which would lose a reply in flight. The id is
    learned on every (re)connect, so it follows a reconnect and a Sentinel failover."""

    def __init__(self) -> None:
        self.client: Redis | None = None
        self.client_id: int | None = None
        # Why the server will not tell the id (an ACL without CLIENT ID), once it said so.
        self.refused: str | None = None

    async def on_connect(self, connection: AbstractConnection) -> None:
        self.client_id = None
        await connection.on_connect()
        await connection.send_command("CLIENT", "ID")
        try:
            self.client_id = int(await connection.read_response())
        except ResponseError as error:
            self.refused = f"CLIENT ID: {error}"


@asynccontextmanager
async def open_pinned_reader(
    url: str, *, socket_timeout_s: float, client_name: str
) -> AsyncIterator[PinnedReader | None]:
    """A `PinnedReader` for `url`, closed on exit; None on a Redis Cluster, whose shards a
    single connection cannot read."""
    if isinstance(parse_redis_url(url), ClusterSeeds):
        yield None
        return
    reader = PinnedReader()
    client, helpers = redis_client(
        url,
        socket_timeout_s=socket_timeout_s,
        client_name=client_name,
        max_connections=1,
        on_connect=reader.on_connect,
    )
    assert isinstance(client, Redis)
    reader.client = client
    try:
        yield reader
    finally:
        await client.aclose()
        for helper in helpers:
            await helper.aclose()
