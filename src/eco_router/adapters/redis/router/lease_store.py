"""Redis adapter of `LeaseStore`: leases, fencing epochs and live routers on the streams server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.connections.slots import by_slot, gather_all
from eco_router.adapters.redis.errors import redis_errors
from eco_router.adapters.redis.keys import GroupKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.port_values import GroupView
from eco_router.application.ports import LeaseStore
from eco_router.domain.ownership import Lease
from eco_router.domain.streams import StreamFamily


class RedisLeaseStore(LeaseStore):
    """One script call per heartbeat, acquisition or release; time is the server's clock."""

    def __init__(
        self, redis: RedisClient, *, families: Sequence[StreamFamily], group: str, ttl_ms: int
    ) -> None:
        self._redis = redis
        self._streams = [s for f in families for s in f.streams]
        self._keys = GroupKeys(group)
        self._ttl_ms = ttl_ms
        self._heartbeat = redis.register_script(load_lua("heartbeat.lua"))
        self._acquire = redis.register_script(load_lua("acquire_lease.lua"))
        self._release = redis.register_script(load_lua("release_lease.lua"))

    async def heartbeat(self, router: str, held: Mapping[str, int]) -> GroupView:
        """One call; on tagged shards one for the live routers and one per slot."""
        tokens = {s: held.get(s, "") for s in self._streams}
        slots = by_slot(tokens)
        with redis_errors("heartbeat"):
            if len(slots) <= 1:
                reply = await self._beat(router, tokens, with_routers=True)
                return self._group_view(reply, list(tokens))
            replies = await gather_all(
                [
                    self._beat(router, {}, with_routers=True),
                    *(self._beat(router, part, with_routers=False) for part in slots),
                ]
            )
        now_ms, routers, _ = replies[0]
        leases = {}
        for part, reply in zip(slots, replies[1:], strict=True):
            # Each lease's expiry is taken from the time it has left (PTTL), so the nodes'
            # clocks need not agree.
            leases.update(self._leases(int(now_ms), list(part), reply[2]))
        return GroupView(int(now_ms), _routers(routers), leases)

    async def _beat(
        self, router: str, tokens: Mapping[str, int | str], *, with_routers: bool
    ) -> list[Any]:
        keys = [self._keys.routers] if with_routers else []
        keys += [k for s in tokens for k in (self._keys.lease(s), self._keys.epoch(s))]
        args = [router, self._ttl_ms, int(with_routers), *tokens.values()]
        reply: list[Any] = await self._heartbeat(keys=keys, args=args)
        return reply

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
            # A cluster pipeline refuses TIME, which belongs to no slot.
            seconds, micros = await self._redis.time()
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zrange(self._keys.routers, 0, -1, withscores=True)
                for stream in self._streams:
                    pipe.hmget(self._keys.lease(stream), "owner", "token", "since")
                    pipe.pttl(self._keys.lease(stream))
                replies = await pipe.execute()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        routers = {_text(r): int(t) for r, t in replies[0] if int(t) > now_ms}
        raw = [[*replies[1 + 2 * n], replies[2 + 2 * n]] for n in range(len(self._streams))]
        return GroupView(now_ms, routers, self._leases(now_ms, self._streams, raw))

    def _group_view(self, reply: list[Any], streams: list[str]) -> GroupView:
        now_ms = int(reply[0])
        return GroupView(now_ms, _routers(reply[1]), self._leases(now_ms, streams, reply[2]))

    def _leases(self, now_ms: int, streams: list[str], raw: list[list[Any]]) -> dict[str, Lease]:
        leases = {}
        for stream, fields in zip(streams, raw, strict=True):
            if fields and fields[0] is not None:
                owner, token, since, left_ms = fields
                leases[stream] = Lease(_text(owner), int(token), int(since), now_ms + int(left_ms))
        return leases


def _routers(flat: list[Any]) -> dict[str, int]:
    return {_text(flat[i]): int(float(flat[i + 1])) for i in range(0, len(flat), 2)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
