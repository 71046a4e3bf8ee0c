"""Clients of a Sentinel group leave its old master as soon as a failover is announced.

In a failover asked of Sentinel (`SENTINEL FAILOVER`) the old master stays up and writable
until Sentinel makes it a replica of the promoted one, seconds later, and then throws away
what it took meanwhile. A client that kept writing there would be told its writes succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from eco_router.adapters.redis.connections.connection import open_redis
from eco_router.testing import SentinelGroup
from tests.integration.topology_fixtures import Shared

pytestmark = pytest.mark.integration

WRITES = "failover-watch:writes"
WAIT_MS = 1000


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
        acknowledged: list[str] = []
        stop = asyncio.Event()
        async with open_redis(group.url, socket_timeout_s=5.0, client_name="watch-test") as client:
            await client.delete(WRITES)

            async def write(writer: int) -> None:
                for n in itertools.count():
                    if stop.is_set():
                        return
                    member = f"{writer}:{n}"
                    # A write refused (its connection closed under it) is not acknowledged,
                    # nor one no replica has (WAIT 1, as EVENT_ROUTER_WAIT_REPLICAS=1 does):
                    # without WAIT, what a replica lagging on a loaded machine had not
                    # received when it was promoted is lost whatever the client does (outside
                    # the guarantee). What is tested is that nothing is acknowledged by the old
                    # master once the failover is under way, which WAIT 1 alone does not stop:
                    # its other replica follows it until Sentinel moves that one too.
                    with contextlib.suppress(RedisError, OSError):
                        async with client.pipeline(transaction=False) as pipe:
                            replies = await pipe.sadd(WRITES, member).wait(1, WAIT_MS).execute()
                        if replies[1] >= 1:
                            acknowledged.append(member)
                    await asyncio.sleep(0.002)

            writers = [asyncio.create_task(write(i)) for i in range(4)]
            try:
                await asyncio.sleep(0.3)
                await _until_every_sentinel_is_listened_to(client, len(group.sentinels))
                old = group.failover()
                began = time.monotonic()
                await asyncio.to_thread(group.wait_for_new_master, old)
                await asyncio.to_thread(group.wait_rejoined, old, 60.0)
                demoted_s = time.monotonic() - began
                before_end = len(acknowledged)
                await asyncio.sleep(0.3)
            finally:
                stop.set()
                await asyncio.gather(*writers)
            kept = {m.decode() for m in await client.smembers(WRITES)}

        lost = [m for m in acknowledged if m not in kept]
        assert demoted_s > 1.0, "the old master was demoted at once: nothing here was at risk"
        assert len(acknowledged) > before_end, "no write went to the promoted master"
        assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged writes lost"


async def _until_every_sentinel_is_listened_to(client: Redis, sentinels: int) -> None:
    """The client listens from its first connection on; a failover asked before it hears
    the sentinels is not what this test is about."""
    watch = client.connection_pool.failover_watch  # type: ignore[attr-defined]
    for _ in range(200):
        if len(watch.listening) == sentinels:
            return
        await asyncio.sleep(0.05)
