"""The look behind after a read: each shard's first entry pending after the reader's position."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.errors import redis_errors
from eco_router.adapters.redis.scripts import load_lua

# What a shard's look behind gives: XPENDING's reply as redis-py shapes it ([] or one
# {"message_id", "consumer", ...}), or the error the server answered for that shard.
Found = list[dict[str, Any]] | Exception


class LookBehind:
    """One script call for every shard (`look_behind.lua`), queued on the read's pipeline
    after the read; an XPENDING per shard on a Redis Cluster, whose pipelines take no
    scripts, or where the shards span slots.

    The script is called by its digest, not loaded by the pipeline (which would ask the
    server for it before every execution); a server that lost it (restarted, failed over)
    answers NOSCRIPT once: the shards are then looked at with XPENDING and the script is
    loaded again.
    """

    def __init__(self, redis: RedisClient, group: str) -> None:
        self._redis = redis
        self._group = group
        self._script = redis.register_script(load_lua("look_behind.lua"))
        self._scripted = not isinstance(redis, RedisCluster)

    def queue(self, pipe: Any, after: Mapping[str, str], *, together: bool) -> None:
        """Queue the look behind of every shard in `after` on `pipe`: one command `together`,
        else one per shard."""
        if together and self._scripted:
            args = [self._group, *after.values()]
            pipe.evalsha(self._script.sha, len(after), *after, *args)
            return
        for stream, last in after.items():
            pipe.xpending_range(stream, self._group, min=f"({last}", max="+", count=1)

    async def found(
        self, replies: list[Any], after: Mapping[str, str], *, together: bool, looked: bool = True
    ) -> list[Found]:
        """Per shard of `after`, what the commands `queue` queued answered; nothing pending
        after any shard when none were queued (not `looked`)."""
        if not looked:
            return [[] for _ in after]
        if not (together and self._scripted):
            return replies
        reply = replies[0]
        if isinstance(reply, NoScriptError):
            return await self._again(after)
        if isinstance(reply, Exception):
            return [reply] * len(after)
        return [_found(item) for item in reply]

    async def _again(self, after: Mapping[str, str]) -> list[Found]:
        with redis_errors("XPENDING"):
            async with self._redis.pipeline(transaction=False) as pipe:
                self.queue(pipe, after, together=False)
                replies: list[Found] = await pipe.execute(raise_on_error=False)
            await self._redis.script_load(self._script.script)
        return replies


def _found(item: list[Any]) -> Found:
    if not item:
        return []
    first, second = item
    if _text(first) == "ERR":
        return ResponseError(_text(second))
    return [{"message_id": first, "consumer": second}]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
