"""Opening and closing the Redis clients the adapters share."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

log = logging.getLogger(__name__)


# redis-py's default pool (capped at 100 in current releases) raises MaxConnectionsError past
# its cap: a burst of SSE clients, each reading its job's view, saw their streams end at once.
MAX_CONNECTIONS = 100


def redis_client(url: str, *, socket_timeout_s: float, client_name: str) -> Redis:
    """A client for `url` (redis://, rediss://, unix://, with user and password) that fails fast.

    Beyond `MAX_CONNECTIONS` concurrent commands, callers wait (up to the socket timeout)
    for a pooled connection instead of failing.
    """
    # TCP keepalive means nothing on a Unix socket, whose connection class refuses the option.
    tcp = {} if url.startswith("unix://") else {"socket_keepalive": True}
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=socket_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=2.0,
        **tcp,
        health_check_interval=15,
        # One quick retry swaps a pooled connection that died with a restarted server; longer
        # outages belong to the router's own back-off, which knows what to keep unacked.
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
        client_name=client_name,
    )
    return Redis.from_pool(pool)


@asynccontextmanager
async def open_redis(
    url: str, *, socket_timeout_s: float, client_name: str, ping: bool = True
) -> AsyncIterator[Redis]:
    """A client that answered PING (fail fast at startup) and is closed on exit."""
    client = redis_client(url, socket_timeout_s=socket_timeout_s, client_name=client_name)
    try:
        if ping:
            await client.ping()
        yield client
    finally:
        await client.aclose()
