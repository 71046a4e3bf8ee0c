"""The `PresenceBoard` contract run against Redis, and what only Redis can show."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from eco_router.adapters.redis.gateway.presence_board import RedisPresenceBoard
from eco_router.adapters.redis.keys import PresenceKeys
from eco_router.application.ports import PresenceBoard
from tests.contracts.presence_board import TTL_S, PresenceBoardContract

NAMESPACE = "sse:events"


class TestRedisPresenceBoard(PresenceBoardContract):
    @pytest.fixture(autouse=True)
    def _backend(self, pubsub_redis: Redis) -> None:
        self.redis = pubsub_redis

    async def make_board(self) -> PresenceBoard:
        return RedisPresenceBoard(self.redis, namespace=NAMESPACE, ttl_s=TTL_S)

    async def let_time_pass(self, seconds: float) -> None:
        # Counts lapse on the server's own clock: only real time lapses them.
        await asyncio.sleep(seconds)

    async def test_every_key_expires_and_shares_one_slot(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3}, whole=True)
        keys = PresenceKeys(NAMESPACE)

        for key in (keys.gateway("gw-a"), keys.gateways):
            assert 0 < await self.redis.pttl(key) <= TTL_S * 1000
        assert key_slot(keys.gateway("gw-a").encode()) == key_slot(keys.gateways.encode())

    async def test_nothing_is_left_once_every_gateway_lapsed(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3}, whole=True)

        await asyncio.sleep(TTL_S + 0.1)

        assert await self.redis.keys("eco-router:presence:*") == []
