"""The console's port contracts on the in-memory adapters."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.dead_letter_archive import InMemoryDeadLetterArchive
from eco_router.adapters.memory.dead_letters import InMemoryDeadLetterSink
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.shard_progress import InMemoryShardProgress
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.ports import (
    DeadLetterArchive,
    DeadLetterSink,
    EventSource,
    ShardProgress,
)
from tests.contracts.console_ports import DeadLetterArchiveContract, Fields, ShardProgressContract
from tests.contracts.factories import GROUP, TAGGED_FAMILIES


class TestInMemoryDeadLetterArchive(DeadLetterArchiveContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.streams = InMemoryStreams(ManualClock())

    async def make_archive(self) -> DeadLetterArchive:
        return InMemoryDeadLetterArchive(self.streams)

    async def make_sink(self) -> DeadLetterSink:
        return InMemoryDeadLetterSink(self.streams)

    async def entries(self, stream: str) -> list[tuple[str, Fields]]:
        return self.streams.entries(stream)


class TestInMemoryShardProgress(ShardProgressContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.streams = InMemoryStreams(ManualClock())

    async def make_progress(self) -> ShardProgress:
        return InMemoryShardProgress(self.streams, families=self.families, group=GROUP)

    async def make_source(self) -> EventSource:
        return InMemoryEventSource(self.streams, families=self.families, group=GROUP, consumer="c")

    async def append(self, stream: str, fields: Mapping[bytes, bytes]) -> str:
        return self.streams.xadd(stream, fields)


# The same contracts on the hash-tagged shard names of a Redis Cluster layout.


class TestInMemoryDeadLetterArchiveTagged(TestInMemoryDeadLetterArchive):
    families = TAGGED_FAMILIES


class TestInMemoryShardProgressTagged(TestInMemoryShardProgress):
    families = TAGGED_FAMILIES
