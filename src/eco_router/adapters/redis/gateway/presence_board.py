"""Redis adapter of `PresenceBoard`: one hash per gateway and a registry, on the Pub/Sub server."""

from __future__ import annotations

from collections.abc import Mapping

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.errors import redis_errors
from eco_router.adapters.redis.keys import PresenceKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.ports import JobRef, PresenceBoard


class RedisPresenceBoard(PresenceBoard):
    """A gateway's counts are a hash (`domain:job` → viewers) with a TTL renewed by each post;
    the registry (a sorted set of gateways by expiry, on the server's clock) says whose are
    live. A reader prunes the lapsed gateways, then reads the job's field of each live one's
    hash. Redis 7.0 has no expiry per hash field, hence one hash per gateway."""

    def __init__(self, redis: RedisClient, *, namespace: str, ttl_s: float) -> None:
        self._redis = redis
        self._keys = PresenceKeys(namespace)
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._post = redis.register_script(load_lua("post_presence.lua"))
        self._live = redis.register_script(load_lua("live_gateways.lua"))
        self._leave = redis.register_script(load_lua("leave_presence.lua"))

    async def post(self, gateway: str, changes: Mapping[JobRef, int], *, whole: bool) -> bool:
        pairs: list[str | int] = []
        for (domain, job_id), count in changes.items():
            pairs += [PresenceKeys.field(domain, job_id), max(0, count)]
        keys = [self._keys.gateway(gateway), self._keys.gateways]
        with redis_errors("post viewer counts", key=keys[1]):
            applied = await self._post(keys=keys, args=[gateway, self._ttl_ms, int(whole), *pairs])
        return bool(int(applied))

    async def leave(self, gateway: str) -> None:
        keys = [self._keys.gateway(gateway), self._keys.gateways]
        with redis_errors("remove viewer counts", key=keys[1]):
            await self._leave(keys=keys, args=[gateway])

    async def viewers(self, domain: str, job_id: str) -> dict[str, int]:
        field = PresenceKeys.field(domain, job_id)
        with redis_errors("read viewer counts", key=self._keys.gateways):
            live = [_text(g) for g in await self._live(keys=[self._keys.gateways])]
            if not live:
                return {}
            # Separate reads: a script may only take the keys it is given, and which
            # gateways are live is known only now. A hash that lapsed meanwhile reads nil.
            counts = [await self._redis.hget(self._keys.gateway(g), field) for g in live]
        return {g: int(c) for g, c in zip(live, counts, strict=True) if c is not None and int(c)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
