"""The port contracts run against the in-memory adapters."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.broadcaster import InMemoryBroadcaster
from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.control_store import InMemoryControlStore
from eco_router.adapters.memory.dead_letters import InMemoryDeadLetterSink
from eco_router.adapters.memory.event_feed import InMemoryEventFeed
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.memory.leases import InMemoryLeaseStore, LeaseTable
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.ports import (
    Broadcaster,
    ControlStore,
    DeadLetterSink,
    EventFeed,
    EventSource,
    GatewayMetrics,
    LeaseStore,
    StateStore,
)
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES
from tests.contracts.broadcaster import PREFIX, BroadcasterContract, Receive
from tests.contracts.control_store import ControlStoreContract
from tests.contracts.dead_letter_sink import DeadLetterSinkContract, Fields
from tests.contracts.event_feed import PREFIX as FEED_PREFIX
from tests.contracts.event_feed import EventFeedContract
from tests.contracts.event_source import EventSourceContract
from tests.contracts.factories import GROUP, TAGGED_FAMILIES
from tests.contracts.lease_store import TTL_MS, LeaseStoreContract
from tests.contracts.state_store import StateStoreContract


class TestInMemoryEventSource(EventSourceContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.clock = ManualClock()
        self.streams = InMemoryStreams(self.clock)

    async def make_source(self, *, consumer: str, group: str = GROUP) -> EventSource:
        return InMemoryEventSource(
            self.streams, families=self.families, group=group, consumer=consumer
        )

    async def append(self, stream: str, fields: Mapping[bytes, bytes]) -> str:
        return self.streams.xadd(stream, fields)

    async def delete_entry(self, stream: str, entry_id: str) -> None:
        self.streams.delete_entry(stream, entry_id)

    async def delete_stream(self, stream: str) -> None:
        self.streams.delete_stream(stream)

    async def break_shard(self, stream: str) -> None:
        self.streams.break_shard(stream)

    async def destroy_group(self, stream: str) -> None:
        self.streams.destroy_group(stream, GROUP)

    async def let_time_pass(self, ms: int) -> None:
        self.clock.advance(ms)

    async def cut_server(self, source: EventSource) -> None:
        assert isinstance(source, InMemoryEventSource)
        source.available = False

    async def set_epoch(self, stream: str, token: int) -> None:
        self.streams.lease_table(GROUP).epochs[stream] = token


class TestInMemoryEventSourceWaitingForAppends(TestInMemoryEventSource):
    """A source whose reads cannot block on the server: a blocking read waits for appends."""

    async def make_source(self, *, consumer: str, group: str = GROUP) -> EventSource:
        return InMemoryEventSource(
            self.streams, families=self.families, group=group, consumer=consumer, blocking=False
        )


class TestInMemoryStateStore(StateStoreContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.clock = ManualClock()
        self.streams = InMemoryStreams(self.clock)
        self.leases = self.streams.lease_table(GROUP)

    async def make_store(
        self,
        *,
        history_size: int = 3,
        history_max_bytes: int = 1 << 20,
        text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES,
    ) -> StateStore:
        return InMemoryStateStore(
            clock=self.clock,
            streams=self.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=history_size,
            history_max_bytes=history_max_bytes,
            text_max_bytes=text_max_bytes,
        )

    async def set_epoch(self, stream: str, token: int) -> None:
        self.leases.epochs[stream] = token

    async def append_and_read(self, stream: str, consumer: str) -> str:
        self.streams.create_group(stream, GROUP)
        entry_id = self.streams.xadd(stream, {"n": "1"})
        self.streams.read_new(GROUP, consumer, [stream], 1)
        return entry_id


class TestInMemoryBroadcaster(BroadcasterContract):
    async def make_broadcaster(self) -> Broadcaster:
        return InMemoryBroadcaster(channel_prefix=PREFIX)

    async def subscribe(self, broadcaster: Broadcaster, channel: str) -> Receive:
        assert isinstance(broadcaster, InMemoryBroadcaster)
        queue = broadcaster.subscribe(channel)

        async def receive() -> bytes:
            async with asyncio.timeout(5):
                return await queue.get()

        return receive

    async def cut_server(self, broadcaster: Broadcaster) -> None:
        assert isinstance(broadcaster, InMemoryBroadcaster)
        broadcaster.available = False


class TestInMemoryEventFeed(EventFeedContract):
    async def make_feed(
        self, *, metrics: GatewayMetrics, queue_size: int = 256
    ) -> tuple[EventFeed, Broadcaster]:
        broadcaster = InMemoryBroadcaster(channel_prefix=FEED_PREFIX)
        feed = InMemoryEventFeed(
            broadcaster, decoder=OrjsonEventDecoder(), metrics=metrics, queue_size=queue_size
        )
        return feed, broadcaster

    async def test_a_close_that_is_cancelled_ends_cancelled(self) -> None:
        feed, _ = await self.make_feed(metrics=InMemoryGatewayMetrics())
        subscription = await feed.subscribe("scan", "job-1")
        closing = asyncio.create_task(subscription.close())
        await asyncio.sleep(0)  # it now waits for its pump to end

        closing.cancel()

        with pytest.raises(asyncio.CancelledError):
            await closing


class TestInMemoryDeadLetterSink(DeadLetterSinkContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.streams = InMemoryStreams(ManualClock())

    async def make_sink(self) -> DeadLetterSink:
        return InMemoryDeadLetterSink(self.streams)

    async def dead_letters(self, stream: str) -> list[Fields]:
        return [fields for _, fields in self.streams.entries(stream)]


class TestInMemoryLeaseStore(LeaseStoreContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.clock = ManualClock()
        self.store = InMemoryLeaseStore(LeaseTable(self.clock), ttl_ms=TTL_MS)

    async def make_store(self) -> LeaseStore:
        return self.store

    async def let_time_pass(self, ms: int) -> None:
        self.clock.advance(ms)

    async def cut_server(self) -> None:
        self.store.available = False


# The same contracts on the hash-tagged shard names of a Redis Cluster layout.


class TestInMemoryEventSourceTagged(TestInMemoryEventSource):
    families = TAGGED_FAMILIES


class TestInMemoryStateStoreTagged(TestInMemoryStateStore):
    families = TAGGED_FAMILIES


class TestInMemoryDeadLetterSinkTagged(TestInMemoryDeadLetterSink):
    families = TAGGED_FAMILIES


class TestInMemoryLeaseStoreTagged(TestInMemoryLeaseStore):
    families = TAGGED_FAMILIES


class TestInMemoryControlStore(ControlStoreContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.clock = ManualClock()
        self.streams = InMemoryStreams(self.clock)
        self.states = InMemoryStateStore(
            clock=self.clock,
            streams=self.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=3,
        )
        self.streams.lease_table(GROUP).epochs[self.chat_0] = 1

    async def make_store(self) -> ControlStore:
        return InMemoryControlStore(
            streams=self.streams,
            states=self.states,
            families=self.families,
            state_ttl_s=3600,
            clock=self.clock,
        )

    async def shard_entries(self, stream: str) -> list[dict[str, str]]:
        return [
            {k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in self.streams.entries(stream)
        ]

    async def control_keys(self, job_id: str) -> int:
        return int(bool(self.streams.entries(f"chat:control:{job_id}")))


class TestInMemoryControlStoreTagged(TestInMemoryControlStore):
    families = TAGGED_FAMILIES
