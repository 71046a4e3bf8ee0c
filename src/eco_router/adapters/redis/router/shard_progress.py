"""Redis adapter of `ShardProgress`: the group's counters from XINFO GROUPS."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.errors import redis_errors
from eco_router.application.port_values import ShardCounters
from eco_router.application.ports import ShardProgress
from eco_router.domain.streams import StreamFamily


class RedisShardProgress(ShardProgress):
    """One pipelined XINFO GROUPS per call: `entries-read` is what the group has read, and
    `entries-read + lag` what was ever appended (Redis ≥ 7.0; older servers tell neither)."""

    def __init__(self, redis: RedisClient, *, families: Sequence[StreamFamily], group: str) -> None:
        self._redis = redis
        self._shards = tuple(s for f in families for s in f.streams)
        self._group = group

    async def counters(self) -> list[ShardCounters]:
        with redis_errors("XINFO GROUPS"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream in self._shards:
                    pipe.xinfo_groups(stream)
                # A missing stream is an error reply for its shard alone.
                replies = await pipe.execute(raise_on_error=False)
        return [self._counters(s, r) for s, r in zip(self._shards, replies, strict=True)]

    def _counters(self, stream: str, reply: object) -> ShardCounters:
        info = _group_info(reply, self._group)
        if info is None:
            return ShardCounters(stream, None, None)
        read, lag = _integer(info.get("entries-read")), _integer(info.get("lag"))
        added = read + lag if read is not None and lag is not None else None
        return ShardCounters(stream, added, read)


def _group_info(reply: object, group: str) -> dict[str, Any] | None:
    if not isinstance(reply, list):
        return None
    for info in reply:
        if not isinstance(info, dict):
            continue
        name = info.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            found: dict[str, Any] = info
            return found
    return None


def _integer(value: object) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            return None
    return None
