"""The port contracts run against the Redis adapters on private redis-server processes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.crc import key_slot
from redis.exceptions import ResponseError

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.redis.connections.connection import open_pinned_reader
from eco_router.adapters.redis.control_store import (
    ControlKeys,
    RedisControlStore,
    append_arguments,
    read_arguments,
)
from eco_router.adapters.redis.gateway.event_feed import RedisPubSubEventFeed
from eco_router.adapters.redis.keys import DeadLetterKeys, GroupKeys, JobKeys
from eco_router.adapters.redis.router.broadcaster import RedisPubSubBroadcaster
from eco_router.adapters.redis.router.dead_letters import RedisStreamDeadLetterSink
from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
from eco_router.adapters.redis.router.lease_store import RedisLeaseStore
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.adapters.system_clock import SystemClock
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
from eco_router.domain.control import Admission
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES
from eco_router.testing import RedisServer
from tests.contracts.broadcaster import PREFIX, BroadcasterContract, Receive
from tests.contracts.control_store import JOB, ControlStoreContract, cancel
from tests.contracts.dead_letter_sink import DeadLetterSinkContract, Fields
from tests.contracts.event_feed import PREFIX as FEED_PREFIX
from tests.contracts.event_feed import EventFeedContract
from tests.contracts.event_source import EventSourceContract
from tests.contracts.factories import GROUP, TAGGED_FAMILIES
from tests.contracts.lease_store import TTL_MS, LeaseStoreContract
from tests.contracts.state_store import StateStoreContract


class TestRedisStreamEventSource(EventSourceContract):
    @pytest.fixture(autouse=True)
    def _backend(self, streams_server: RedisServer, streams_redis: Redis) -> None:
        self.server = streams_server
        self.redis = streams_redis
        self.url = streams_server.url

    @pytest.fixture(autouse=True)
    async def _readers(self) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as readers:
            self.readers = readers
            yield

    async def make_source(self, *, consumer: str, group: str = GROUP) -> EventSource:
        reader = await self.readers.enter_async_context(
            open_pinned_reader(self.url, socket_timeout_s=10.0, client_name="reader")
        )
        return RedisStreamEventSource(
            self.redis, families=self.families, group=group, consumer=consumer, reader=reader
        )

    async def append(self, stream: str, fields: Mapping[bytes, bytes]) -> str:
        entry_id = await self.redis.xadd(stream, dict(fields))  # type: ignore[arg-type]
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    async def delete_entry(self, stream: str, entry_id: str) -> None:
        assert await self.redis.xdel(stream, entry_id) == 1

    async def delete_stream(self, stream: str) -> None:
        await self.redis.delete(stream)

    async def break_shard(self, stream: str) -> None:
        await self.redis.delete(stream)
        await self.redis.set(stream, "x")

    async def destroy_group(self, stream: str) -> None:
        await self.redis.xgroup_destroy(stream, GROUP)

    async def let_time_pass(self, ms: int) -> None:
        # Idle times are the server's own clock: only real time makes entries idle.
        await asyncio.sleep(ms / 1000)

    async def cut_server(self, source: EventSource) -> None:
        self.server.stop()

    async def set_epoch(self, stream: str, token: int) -> None:
        await self.redis.set(GroupKeys(GROUP).epoch(stream), token)


class TestRedisStreamEventSourceWaitingForAppends(TestRedisStreamEventSource):
    """Without a reader of its own (as on a Redis Cluster) a blocking read waits for appends."""

    async def make_source(self, *, consumer: str, group: str = GROUP) -> EventSource:
        return RedisStreamEventSource(
            self.redis, families=self.families, group=group, consumer=consumer
        )


class TestRedisLuaStateStore(StateStoreContract):
    @pytest.fixture(autouse=True)
    def _backend(self, streams_redis: Redis) -> None:
        self.redis = streams_redis

    async def make_store(
        self,
        *,
        history_size: int = 3,
        history_max_bytes: int = 1 << 20,
        text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES,
    ) -> StateStore:
        return RedisLuaStateStore(
            self.redis,
            group=GROUP,
            families=self.families,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=history_size,
            history_max_bytes=history_max_bytes,
            text_max_bytes=text_max_bytes,
        )

    async def set_epoch(self, stream: str, token: int) -> None:
        await self.redis.set(GroupKeys(GROUP).epoch(stream), token)

    async def append_and_read(self, stream: str, consumer: str) -> str:
        with contextlib.suppress(ResponseError):  # BUSYGROUP
            await self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        entry_id = await self.redis.xadd(stream, {"n": "1"})
        await self.redis.xreadgroup(GROUP, consumer, {stream: ">"}, count=1)
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


class TestRedisPubSubBroadcaster(BroadcasterContract):
    @pytest.fixture(autouse=True)
    async def _backend(
        self, pubsub_server: RedisServer, pubsub_redis: Redis
    ) -> AsyncIterator[None]:
        self.server = pubsub_server
        self.redis = pubsub_redis
        self.subscriptions: list[PubSub] = []
        yield
        for pubsub in self.subscriptions:
            await pubsub.aclose()

    async def make_broadcaster(self) -> Broadcaster:
        return RedisPubSubBroadcaster(self.redis, channel_prefix=PREFIX)

    async def subscribe(self, broadcaster: Broadcaster, channel: str) -> Receive:
        pubsub = self.redis.pubsub()
        self.subscriptions.append(pubsub)
        await pubsub.subscribe(channel)
        # A publish from another connection only reaches us once the server confirmed.
        confirmation = await _next_message(pubsub)
        assert confirmation["type"] == "subscribe"

        async def receive() -> bytes:
            message = await _next_message(pubsub)
            assert message["type"] == "message"
            assert message["channel"] == channel.encode()
            data = message["data"]
            assert isinstance(data, bytes)
            return data

        return receive

    async def cut_server(self, broadcaster: Broadcaster) -> None:
        self.server.stop()


async def _next_message(pubsub: PubSub) -> dict[str, Any]:
    async with asyncio.timeout(5):
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is not None:
                return message


class TestRedisPubSubEventFeed(EventFeedContract):
    @pytest.fixture(autouse=True)
    async def _backend(self, pubsub_redis: Redis) -> AsyncIterator[None]:
        self.redis = pubsub_redis
        self.feeds: list[RedisPubSubEventFeed] = []
        yield
        for feed in self.feeds:
            await feed.stop()

    async def make_feed(
        self, *, metrics: GatewayMetrics, queue_size: int = 256
    ) -> tuple[EventFeed, Broadcaster]:
        feed = RedisPubSubEventFeed(
            self.redis,
            channel_prefix=FEED_PREFIX,
            decoder=OrjsonEventDecoder(),
            metrics=metrics,
            queue_size=queue_size,
        )
        await feed.start()
        self.feeds.append(feed)
        return feed, RedisPubSubBroadcaster(self.redis, channel_prefix=FEED_PREFIX)


class TestRedisStreamDeadLetterSink(DeadLetterSinkContract):
    @pytest.fixture(autouse=True)
    def _backend(self, streams_redis: Redis) -> None:
        self.redis = streams_redis

    async def make_sink(self) -> DeadLetterSink:
        return RedisStreamDeadLetterSink(self.redis)

    async def dead_letters(self, stream: str) -> list[Fields]:
        entries = await self.redis.xrange(stream)
        return [fields for _, fields in entries]

    async def test_an_entrys_marker_lives_for_the_marker_ttl_beside_its_letter(self) -> None:
        sink = RedisStreamDeadLetterSink(self.redis, marker_ttl_s=60)
        letter = self.letter()
        dead_letter_stream = self.scan.dead_letter_stream

        await sink.send([letter])

        marker = DeadLetterKeys(dead_letter_stream).marker(
            letter.delivery.stream, letter.delivery.entry_id
        )
        assert 0 < await self.redis.pttl(marker) <= 60_000
        assert key_slot(marker.encode()) == key_slot(dead_letter_stream.encode())


class TestRedisLeaseStore(LeaseStoreContract):
    @pytest.fixture(autouse=True)
    def _backend(self, streams_server: RedisServer, streams_redis: Redis) -> None:
        self.server = streams_server
        self.redis = streams_redis

    async def make_store(self) -> LeaseStore:
        return RedisLeaseStore(self.redis, families=self.families, group=GROUP, ttl_ms=TTL_MS)

    async def let_time_pass(self, ms: int) -> None:
        # Leases expire on the server's own clock: only real time lapses them.
        await asyncio.sleep(ms / 1000)

    async def cut_server(self) -> None:
        self.server.stop()


# The same contracts on the hash-tagged shard names of a Redis Cluster layout, on a standalone
# server (which takes any key): the adapters' tagged layout without a cluster.


class TestRedisStreamEventSourceTagged(TestRedisStreamEventSource):
    families = TAGGED_FAMILIES


class TestRedisLuaStateStoreTagged(TestRedisLuaStateStore):
    families = TAGGED_FAMILIES


class TestRedisStreamDeadLetterSinkTagged(TestRedisStreamDeadLetterSink):
    families = TAGGED_FAMILIES


class TestRedisLeaseStoreTagged(TestRedisLeaseStore):
    families = TAGGED_FAMILIES


class TestRedisControlStore(ControlStoreContract):
    @pytest.fixture(autouse=True)
    def _backend(self, streams_redis: Redis) -> None:
        self.redis = streams_redis

    @pytest.fixture(autouse=True)
    async def _states(self, _backend: None) -> None:
        self.states = RedisLuaStateStore(
            self.redis,
            group=GROUP,
            families=self.families,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=3,
        )
        await self.redis.set(GroupKeys(GROUP).epoch(self.chat_0), 1)

    async def make_store(self) -> ControlStore:
        return RedisControlStore(
            self.redis, families=self.families, state_ttl_s=3600, clock=SystemClock()
        )

    async def shard_entries(self, stream: str) -> list[dict[str, str]]:
        return [
            {k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in await self.redis.xrange(stream)
        ]

    async def control_keys(self, job_id: str) -> int:
        job = JobKeys.in_family(self.chat, job_id)
        return int(await self.redis.exists(job.control, job.control_state))

    async def test_the_control_keys_live_the_state_ttl(self) -> None:
        store = await self.started()
        await self.send(store, cancel())
        job = JobKeys.in_family(self.chat, JOB)

        assert 3500 < await self.redis.ttl(job.control) <= 3600
        assert 3500 < await self.redis.ttl(job.control_state) <= 3600

    async def test_acknowledging_after_the_keys_expired_leaves_no_key_without_ttl(self) -> None:
        store = await self.started()
        receipt = await self.send(store, cancel())
        assert receipt.message_id is not None
        job = JobKeys.in_family(self.chat, JOB)
        await self.redis.delete(job.control, job.control_state)

        assert not await store.acknowledge("chat", JOB, receipt.message_id)
        assert not await self.redis.exists(job.control_state)


class TestRedisControlStoreTagged(TestRedisControlStore):
    families = TAGGED_FAMILIES

    def test_a_record_touches_one_slot(self) -> None:
        request = cancel()
        keys, _ = append_arguments(
            request,
            Admission(number=1),
            ControlKeys(self.families),
            version=0,
            state_ttl_s=60,
            now_ms=0,
        )
        read_keys, _ = read_arguments(request, ControlKeys(self.families))

        assert len({key_slot(k.encode()) for k in (*keys, *read_keys)}) == 1
