"""The look behind after a read, on a server that lost its scripts (restarted, failed over)."""

from __future__ import annotations

from redis.asyncio import Redis

from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
from eco_router.domain.streams import StreamFamily

FAMILY = StreamFamily("scan:events", 2)
GROUP = "router"


def source(redis: Redis, consumer: str) -> RedisStreamEventSource:
    return RedisStreamEventSource(redis, families=[FAMILY], group=GROUP, consumer=consumer)


async def test_a_gap_is_found_after_the_script_was_flushed_and_the_script_comes_back(
    streams_redis: Redis,
) -> None:
    mine, stale = source(streams_redis, "router-a"), source(streams_redis, "router-b")
    await mine.prepare()
    stream = FAMILY.streams[0]
    await streams_redis.xadd(stream, {"job_id": "job-1", "seq": "1"})
    await stale.read_new({stream: "0-0"}, count=10)  # read by a router that lost the shard
    await streams_redis.script_flush()

    read = await mine.read_new(dict.fromkeys(FAMILY.streams, "0-0"), count=10)

    assert read.gaps == {stream}
    assert read.deliveries == []
    again = await mine.read_new(dict.fromkeys(FAMILY.streams, "0-0"), count=10)
    assert again.gaps == {stream}
    scripts = await streams_redis.info("commandstats")
    assert scripts["cmdstat_evalsha"]["calls"] >= 2
    assert scripts.get("cmdstat_xpending", {}).get("calls", 0) >= 2
