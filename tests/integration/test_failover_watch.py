"""Clients of a Sentinel group leave its old master as soon as a failover is announced.

In a failover asked of Sentinel (`SENTINEL FAILOVER`) the old master stays up and writable
until Sentinel makes it a replica of the promoted one, seconds later, and then throws away
what it took meanwhile. A client that kept writing there would be told its writes succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from eco_router.adapters.redis.connection import open_redis
from eco_router.testing import SentinelGroup
from tests.integration.topology_fixtures import Shared

pytestmark = pytest.mark.integration

COUNTER = "failover-watch:counter"


@pytest.fixture
def group(shared_sentinel: Shared[SentinelGroup]) -> SentinelGroup:
    """The shared Sentinel group, started again for the next test (this one fails it over)."""
    try:
        yield shared_sentinel.get()
    finally:
        shared_sentinel.broken = True


class TestFailoverAskedOfSentinel:
    async def test_no_write_acknowledged_during_the_failover_is_lost(
        self, group: SentinelGroup
    ) -> None:
        acknowledged = 0
        stop = asyncio.Event()
        async with open_redis(group.url, socket_timeout_s=5.0, client_name="watch-test") as client:
            await client.delete(COUNTER)

            async def write() -> None:
                nonlocal acknowledged
                while not stop.is_set():
                    # A write refused (its connection closed under it) is not acknowledged.
                    with contextlib.suppress(RedisError, OSError):
                        await client.incr(COUNTER)
                        acknowledged += 1
                    await asyncio.sleep(0.002)

            writers = [asyncio.create_task(write()) for _ in range(4)]
            try:
                await asyncio.sleep(0.3)
                await _until_every_sentinel_is_listened_to(client, len(group.sentinels))
                old = group.failover()
                began = time.monotonic()
                await asyncio.to_thread(group.wait_for_new_master, old)
                await asyncio.to_thread(group.wait_rejoined, old, 60.0)
                demoted_s = time.monotonic() - began
                before_end = acknowledged
                await asyncio.sleep(0.3)
            finally:
                stop.set()
                await asyncio.gather(*writers)
            kept = int(await client.get(COUNTER) or 0)

        assert demoted_s > 1.0, "the old master was demoted at once: nothing here was at risk"
        assert acknowledged > before_end, "no write went to the promoted master"
        assert kept == acknowledged, f"{acknowledged - kept} acknowledged writes lost"


async def _until_every_sentinel_is_listened_to(client: Redis, sentinels: int) -> None:
    """The client listens from its first connection on; a failover asked before it hears
    the sentinels is not what this test is about."""
    watch = client.connection_pool.failover_watch  # type: ignore[attr-defined]
    for _ in range(200):
        if len(watch.listening) == sentinels:
            return
        await asyncio.sleep(0.05)
