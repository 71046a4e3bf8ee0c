"""A consumer group destroyed again while the router creates the others back (an operator
destroying them one by one): it is created back at the router's position by the next read,
never quarantined (whose retry would create it at the start and route everything again)."""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio import Redis

from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
from eco_router.application.errors import PermanentError
from eco_router.domain.streams import StreamFamily

FAMILY = StreamFamily("scan:events", 4)
GROUP = "router"
FIRST, LAST = FAMILY.streams[0], FAMILY.streams[3]


class DestroyedMeanwhile(RedisStreamEventSource):
    """Once `armed`, destroys the last shard's group right after it created groups back."""

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis, families=[FAMILY], group=GROUP, consumer="router-a")
        self.admin = redis
        self.armed = False
        self.raced = False

    async def _create_groups(
        self, at: Mapping[str, str]
    ) -> tuple[dict[str, PermanentError], list[str]]:
        created = await super()._create_groups(at)
        if self.armed and not self.raced:
            self.raced = True
            await self.admin.xgroup_destroy(LAST, GROUP)
        return created


async def test_a_group_destroyed_while_others_are_created_back_is_not_quarantined(
    streams_redis: Redis,
) -> None:
    source = DestroyedMeanwhile(streams_redis)
    await source.prepare()
    for stream in FAMILY.streams:
        await streams_redis.xadd(stream, {"job_id": "j", "seq": "1"})
    first = await source.read_new(dict.fromkeys(FAMILY.streams, "0-0"), count=10)
    positions = {d.stream: d.entry_id for d in first.deliveries}
    await streams_redis.xgroup_destroy(FIRST, GROUP)
    source.armed = True

    read = await source.read_new(positions, count=10)
    again = await source.read_new(positions, count=10)

    assert source.raced
    assert read.broken == {}
    assert read.regrouped == {FIRST: positions[FIRST]}
    assert again.regrouped == {LAST: positions[LAST]}
    assert read.deliveries == again.deliveries == []
