"""Writes acknowledged by replicas (WAIT on the writing connection), on Redis Sentinel and on
Redis Cluster: the producer SDK and the state store wait for them, and say so when the
replicas do not answer in time."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest

from eco_router.adapters.redis.connections.connection import RedisClient, async_redis_client
from eco_router.adapters.redis.connections.replica_wait import ReplicasBehind, ReplicaWait
from eco_router.adapters.redis.control_store import RedisControlStore
from eco_router.adapters.redis.keys import JobKeys
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.adapters.system_clock import SystemClock
from eco_router.application.send_control import SendControl
from eco_router.domain.control import ControlKind, Recorded, control_request
from eco_router.domain.streams import StreamFamily
from eco_router.producer import connect, connect_async, producer_config
from eco_router.testing import ClusterGroup, RedisServer, SentinelGroup
from tests.contracts.factories import encoded
from tests.integration.topology_fixtures import Shared


@pytest.fixture(params=["sentinel", "cluster"])
def topology(request: pytest.FixtureRequest) -> Iterator[SentinelGroup | ClusterGroup]:
    name = "sentinel" if request.param == "sentinel" else "cluster"
    group = request.getfixturevalue("sentinel_group" if name == "sentinel" else "redis_cluster")
    _paused.clear()
    yield group
    if _paused:
        # Replicas paused past the failure detection: the next test gets a fresh group.
        shared: Shared[SentinelGroup] | Shared[ClusterGroup] = request.getfixturevalue(
            f"shared_{name}"
        )
        shared.broken = True


_paused: list[RedisServer] = []


@pytest.fixture
async def client(topology: SentinelGroup | ClusterGroup) -> AsyncIterator[RedisClient]:
    redis = async_redis_client(topology.url)
    yield redis
    await redis.aclose()


def replicas_of(topology: SentinelGroup | ClusterGroup, key: str) -> list[RedisServer]:
    """The replicas that hold `key`'s copy."""
    if isinstance(topology, SentinelGroup):
        return topology.replicas()
    slot = topology.slot_for_key(key)
    return [r for m in topology.masters() if m.serves(slot) for r in m.replicas]


@contextmanager
def paused(servers: list[RedisServer]) -> Iterator[None]:
    """The servers stopped (SIGSTOP): connected, but acknowledging nothing."""
    _paused.extend(servers)
    for server in servers:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for server in servers:
            assert server.pid is not None
            os.kill(server.pid, signal.SIGCONT)


def family_for(topology: SentinelGroup | ClusterGroup) -> StreamFamily:
    return StreamFamily("scan:events", 4, tagged=isinstance(topology, ClusterGroup))


class TestProducer:
    async def test_a_call_returns_once_a_replica_has_the_entry(
        self, topology: SentinelGroup | ClusterGroup, client: RedisClient
    ) -> None:
        publisher = connect_async(topology.url, producer_config(wait_replicas=1))

        entry_id = await publisher.publish_stage_event("job-1", "queued", "queued")

        stream = publisher.config.family.stream_for("job-1")
        assert [i.decode() for i, _ in await client.xrange(stream)] == [entry_id]

    async def test_replicas_that_do_not_answer_in_time_raise_and_a_retry_adds_nothing(
        self, topology: SentinelGroup | ClusterGroup, client: RedisClient
    ) -> None:
        config = producer_config(wait_replicas=1, wait_timeout_ms=300)
        publisher = connect_async(topology.url, config)
        stream = publisher.config.family.stream_for("job-2")

        with paused(replicas_of(topology, stream)), pytest.raises(ReplicasBehind):
            await publisher.publish_stage_event("job-2", "queued", "queued")
        again = await publisher.publish_stage_event("job-2", "queued", "queued")

        assert [i.decode() for i, _ in await client.xrange(stream)] == [again]

    async def test_the_synchronous_publisher_waits_too(
        self, topology: SentinelGroup | ClusterGroup
    ) -> None:
        publisher = connect(topology.url, producer_config(wait_replicas=1, wait_timeout_ms=300))
        stream = publisher.config.family.stream_for("job-3")

        with paused(replicas_of(topology, stream)), pytest.raises(ReplicasBehind):
            await asyncio.to_thread(publisher.publish_stage_event, "job-3", "queued", "queued")
        assert publisher.publish_stage_event("job-3", "queued", "queued")


class TestStateStore:
    async def test_a_batch_is_applied_only_once_a_replica_has_it(
        self, topology: SentinelGroup | ClusterGroup, client: RedisClient
    ) -> None:
        family = family_for(topology)
        streams = family.streams
        store = RedisLuaStateStore(
            client,
            group="router",
            state_ttl_s=60,
            markers_ttl_s=60,
            history_size=10,
            families=[family],
            replica_wait=ReplicaWait(1, 300),
        )
        events = [
            encoded(job_id=f"job-{n}", stream=family.stream_for(f"job-{n}"), seq=1)
            for n in range(8)
        ]
        fence = dict.fromkeys({e.event.stream for e in events}, 0)
        applied = await store.apply(events, fence)
        assert all(j is not None for j in applied.judgements)

        late = [encoded(job_id="job-9", stream=family.stream_for("job-9"), seq=1)]
        with paused(replicas_of(topology, late[0].event.stream)), pytest.raises(ReplicasBehind):
            await store.apply(late, dict.fromkeys(streams, 0))


class TestControlStore:
    async def test_a_control_message_is_answered_once_a_replica_has_it(
        self, topology: SentinelGroup | ClusterGroup, client: RedisClient
    ) -> None:
        family = StreamFamily("chat:events", 4, tagged=isinstance(topology, ClusterGroup))
        store = RedisControlStore(
            client, families=[family], clock=SystemClock(), replica_wait=ReplicaWait(1, 300)
        )
        request = control_request("chat", "job-c", ControlKind.CANCEL, b"", "r-1")
        stream = family.stream_for("job-c")
        # The job has started: a router applied its first event.
        await client.set(JobKeys.in_family(family, "job-c").state, '{"stage":"queued"}')
        send = SendControl(store=store, clock=SystemClock())

        with paused(replicas_of(topology, stream)), pytest.raises(ReplicasBehind):
            await send(request)
        again = await send(request)

        assert again.outcome is Recorded.DUPLICATE
        assert (await store.messages("chat", "job-c")).total == 1
