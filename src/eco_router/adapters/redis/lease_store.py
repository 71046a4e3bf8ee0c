"""Redis adapter of `LeaseStore`: leases, fencing epochs and live routers on the streams server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from eco_router.adapters.redis.errors import redis_errors
from eco_router.adapters.redis.keys import GroupKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.messages import GroupView
from eco_router.application.ports import LeaseStore
from eco_router.domain.ownership import Lease
from eco_router.domain.streams import StreamFamily


class RedisLeaseStore(LeaseStore):
    """One script call per heartbeat, acquisition or release; time is the server's clock."""

    def __init__(
        self, redis: Redis, *, families: Sequence[StreamFamily], group: str, ttl_ms: int
    ) -> None:
        self._redis = redis
        self._streams = [s for f in families for s in f.streams]
        self._keys = GroupKeys(group)
        self._ttl_ms = ttl_ms
        self._heartbeat = redis.register_script(load_lua("heartbeat.lua"))
        self._acquire = redis.register_script(load_lua("acquire_lease.lua"))
        self._release = redis.register_script(load_lua("release_lease.lua"))

    async def heartbeat(self, router: str, held: Mapping[str, int]) -> GroupView:
        keys = [self._keys.routers]
        keys += [k for s in self._streams for k in (self._keys.lease(s), self._keys.epoch(s))]
        args = [router, self._ttl_ms, *(held.get(s, "") for s in self._streams)]
        with redis_errors("heartbeat"):
            reply = await self._heartbeat(keys=keys, args=args)
        return self._group_view(reply)

    async def acquire(self, stream: str, router: str) -> Lease | None:
        keys = [self._keys.lease(stream), self._keys.epoch(stream)]
        with redis_errors(f"acquire the lease of {stream}"):
            reply = await self._acquire(keys=keys, args=[router, self._ttl_ms])
        if reply is None:
            return None
        token, since_ms = int(reply[0]), int(reply[1])
        return Lease(router, token, since_ms, since_ms + self._ttl_ms)

    async def release(self, stream: str, router: str, token: int) -> None:
        keys = [self._keys.lease(stream), self._keys.epoch(stream)]
        with redis_errors(f"release the lease of {stream}"):
            await self._release(keys=keys, args=[token])

    async def leave(self, router: str) -> None:
        with redis_errors("leave the live routers"):
            await self._redis.zrem(self._keys.routers, router)

    async def view(self) -> GroupView:
        with redis_errors("read the group's leases"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.time()
                pipe.zrange(self._keys.routers, 0, -1, withscores=True)
                for stream in self._streams:
                    pipe.hmget(self._keys.lease(stream), "owner", "token", "since")
                    pipe.pttl(self._keys.lease(stream))
                replies = await pipe.execute()
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        routers = {_text(r): int(t) for r, t in replies[1] if int(t) > now_ms}
        raw = [[*replies[2 + 2 * n], replies[3 + 2 * n]] for n in range(len(self._streams))]
        return GroupView(now_ms, routers, self._leases(now_ms, raw))

    def _group_view(self, reply: list[Any]) -> GroupView:
        now_ms = int(reply[0])
        flat = reply[1]
        routers = {_text(flat[i]): int(float(flat[i + 1])) for i in range(0, len(flat), 2)}
        return GroupView(now_ms, routers, self._leases(now_ms, reply[2]))

    def _leases(self, now_ms: int, raw: list[list[Any]]) -> dict[str, Lease]:
        leases = {}
        for stream, fields in zip(self._streams, raw, strict=True):
            if fields and fields[0] is not None:
                owner, token, since, left_ms = fields
                leases[stream] = Lease(_text(owner), int(token), int(since), now_ms + int(left_ms))
        return leases


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
