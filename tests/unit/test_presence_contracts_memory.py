"""The `PresenceBoard` contract run against the in-memory adapter."""

from __future__ import annotations

import pytest

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.presence_board import InMemoryPresenceBoard
from eco_router.application.ports import PresenceBoard
from tests.contracts.presence_board import TTL_S, PresenceBoardContract


class TestInMemoryPresenceBoard(PresenceBoardContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.clock = ManualClock()

    async def make_board(self) -> PresenceBoard:
        return InMemoryPresenceBoard(clock=self.clock, ttl_s=TTL_S)

    async def let_time_pass(self, seconds: float) -> None:
        self.clock.advance(round(seconds * 1000))
