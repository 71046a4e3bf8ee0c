"""More routers than shards: the extra ones are standbys, and one takes a dead router's shard.

Default settings except the servers, the ports and the shard count (2, so three workers are
one too many).
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from eco_router.adapters.redis.keys import GroupKeys
from eco_router.domain.streams import StreamFamily
from tests.integration.support import (
    GROUP,
    PubSubCollector,
    WorkerProcess,
    Workers,
    add_event,
    eventually,
    job_in_shard,
)

TWO = StreamFamily("scan:events", 2)
DEFAULTS = {
    "EVENT_ROUTER_STREAMS": "scan:events=2",
    # Back to the documented defaults that the test environment shortens.
    "EVENT_ROUTER_READ_BLOCK_MS": "5000",
    "EVENT_ROUTER_STATS_INTERVAL_S": "5",
}


async def holders(redis: Redis) -> dict[str, str | None]:
    """Shard → the router holding its lease (None: free)."""
    keys = GroupKeys(GROUP)
    found = {}
    for stream in TWO.streams:
        owner = await redis.hget(keys.lease(stream), "owner")  # type: ignore[misc]
        found[stream] = owner.decode() if owner else None
    return found


async def held_by(worker: WorkerProcess) -> float:
    return await worker.metric("event_router_shard_held")


class TestStandbys:
    async def test_a_standby_holds_nothing_and_takes_a_killed_router_s_shard_within_the_ttl(
        self, workers: Workers, streams_redis: Redis, subscriber: PubSubCollector
    ) -> None:
        first = await workers.start(EVENT_ROUTER_CONSUMER_NAME="router-a", **DEFAULTS)
        second = await workers.start(EVENT_ROUTER_CONSUMER_NAME="router-b", **DEFAULTS)
        await eventually(
            lambda: _owners(streams_redis, {"router-a", "router-b"}), what="one shard each"
        )
        standby = await workers.start(EVENT_ROUTER_CONSUMER_NAME="router-c", **DEFAULTS)
        await eventually(lambda: _routers_alive(standby, 3), what="the standby seen alive")
        assert await held_by(standby) == 0
        assert sorted(filter(None, (await holders(streams_redis)).values())) == [
            "router-a",
            "router-b",
        ]

        victim_shard = next(s for s, o in (await holders(streams_redis)).items() if o == "router-a")
        first.kill()
        killed_at = time.monotonic()
        await eventually(
            lambda: _owner_is(streams_redis, victim_shard, "router-c"),
            every_s=0.02,
            what="the standby holding the dead router's shard",
        )
        taken_after_s = time.monotonic() - killed_at

        print(f"standby took the shard {taken_after_s:.2f} s after the kill")
        # Default TTL 4 s: the standby looks again right after the lease lapses.
        assert taken_after_s < 6.0, f"taken over after {taken_after_s:.2f} s"
        job = job_in_shard(TWO, int(victim_shard.rsplit(":", 1)[1]), "standby-job")
        await add_event(streams_redis, job, 1, family=TWO)
        await eventually(lambda: subscriber.seqs(job) == [1], what="routed by the standby")
        assert await held_by(second) == 1
        assert await held_by(standby) == 1


async def _owners(redis: Redis, expected: set[str]) -> bool:
    return set((await holders(redis)).values()) == expected


async def _owner_is(redis: Redis, stream: str, owner: str) -> bool:
    return (await holders(redis))[stream] == owner


async def _routers_alive(worker: WorkerProcess, count: int) -> bool:
    return await worker.metric("event_router_routers_alive") == count
