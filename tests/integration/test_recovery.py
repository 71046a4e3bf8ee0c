"""Recovery: dead consumers, entries deleted while pending, lost groups, server outages."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
from eco_router.testing import RedisServer
from tests.integration.support import (
    FAMILIES,
    GROUP,
    SCAN,
    PubSubCollector,
    Workers,
    add_event,
    dead_letters,
    eventually,
    job_in_shard,
    job_state,
    pending_by_consumer,
    pending_count,
)
from tests.tcp_relay import Mode, TcpRelay


def consumer(redis: Redis, name: str) -> RedisStreamEventSource:
    """A bare consumer of the router's group, to hold entries the way a crashed worker would."""
    return RedisStreamEventSource(redis, families=FAMILIES, group=GROUP, consumer=name)


async def read_without_ack(redis: Redis, name: str, expected: int) -> None:
    source = consumer(redis, name)
    read: list[object] = []
    # Nobody has taken the shards yet: their fencing epoch is 0.
    never_taken = {stream: 0 for family in FAMILIES for stream in family.streams}

    async def read_some() -> bool:
        read.extend((await source.read_new(never_taken, count=1000)).deliveries)
        return len(read) >= expected

    await eventually(read_some, what=f"{expected} entries read by {name}")


class TestTakeOverFromADeadConsumer:
    """With the default settings: the reclaimer's 5-minute idle time plays no part."""

    async def test_entries_a_dead_consumer_left_unacked_are_taken_over_and_published(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        await consumer(streams_redis, "dead").prepare()
        jobs = [job_in_shard(SCAN, shard, "scan-orphan") for shard in range(SCAN.shards)]
        for seq in range(1, 6):
            for job in jobs:
                await add_event(streams_redis, job, seq)
        await read_without_ack(streams_redis, "dead", expected=20)
        assert await pending_by_consumer(streams_redis) == {"dead": 20}

        worker = await workers.start(EVENT_ROUTER_CONSUMER_NAME="survivor")

        await eventually(
            lambda: all(subscriber.seqs(job) == [1, 2, 3, 4, 5] for job in jobs),
            what="every orphaned event published in order",
        )
        assert await eventually(lambda: _nothing_pending(streams_redis), what="all acked")
        taken = await worker.metric_reaching("event_router_takeovers_total", 4, domain="scan")
        assert taken == 4
        assert await worker.metric("event_router_reclaimed_total") == 0

    async def test_a_sigkilled_worker_s_pending_entries_are_taken_over_by_another_worker(
        self,
        workers: Workers,
        subscriber: PubSubCollector,
        streams_redis: Redis,
        pubsub_redis: Redis,
    ) -> None:
        doomed = await workers.start(EVENT_ROUTER_CONSUMER_NAME="doomed")
        jobs = [job_in_shard(SCAN, 3, f"scan-load-{n}") for n in range(3)]
        # Paused writes hold the worker inside its publish, with the whole batch pending.
        await pubsub_redis.client_pause(10_000, all=False)
        try:
            # One shard in one transaction: a blocked read wakes with all of it as one batch.
            async with streams_redis.pipeline(transaction=True) as pipe:
                for seq in range(1, 31):
                    job = jobs[seq % 3]
                    pipe.xadd(SCAN.stream_for(job), {"job_id": job, "seq": seq})
                await pipe.execute()
            await eventually(
                lambda: _pending_of(streams_redis, "doomed", 30), what="the batch held by doomed"
            )
            doomed.kill()
        finally:
            await pubsub_redis.client_unpause()

        await workers.start(EVENT_ROUTER_CONSUMER_NAME="heir")

        expected = {job: [s for s in range(1, 31) if s % 3 == n] for n, job in enumerate(jobs)}
        await eventually(
            lambda: {job: _deduplicated(subscriber.seqs(job)) for job in expected} == expected,
            what="every event of the killed worker published",
        )
        assert await eventually(lambda: _nothing_pending(streams_redis), what="all acked")


class TestEntriesDeletedWhilePending:
    async def test_entries_deleted_from_another_consumer_s_pending_list_are_acked_and_counted(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        await consumer(streams_redis, "dead").prepare()
        deleted_job = job_in_shard(SCAN, 0, "scan-xdel")
        trimmed_job = job_in_shard(SCAN, 1, "scan-xtrim")
        ids = [await add_event(streams_redis, deleted_job, seq) for seq in (1, 2, 3)]
        for seq in (1, 2):
            await add_event(streams_redis, trimmed_job, seq)
        await read_without_ack(streams_redis, "dead", expected=5)
        await streams_redis.xdel(SCAN.stream_for(deleted_job), ids[0], ids[1])
        await streams_redis.xtrim(SCAN.stream_for(trimmed_job), maxlen=0)

        worker = await workers.start()

        await eventually(lambda: _nothing_pending(streams_redis), what="every entry acked")
        trimmed = await worker.metric_reaching(
            "event_router_trimmed_before_ack_total", 4, domain="scan"
        )
        assert trimmed == 4
        await eventually(lambda: subscriber.seqs(deleted_job) == [3], what="the survivor routed")
        # The group is not stuck: later entries of both jobs still flow.
        await add_event(streams_redis, deleted_job, 4)
        await add_event(streams_redis, trimmed_job, 3)
        await eventually(lambda: subscriber.seqs(deleted_job) == [3, 4], what="xdel job flows")
        await eventually(lambda: subscriber.seqs(trimmed_job) == [3], what="xtrim job flows")
        assert await dead_letters(streams_redis) == []
        assert subscriber.seqs(trimmed_job) == [3]

    async def test_entries_deleted_from_the_worker_s_own_pending_list_are_acked_on_restart(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        await consumer(streams_redis, "router-0").prepare()
        job = job_in_shard(SCAN, 2, "scan-own")
        ids = [await add_event(streams_redis, job, seq) for seq in (1, 2, 3, 4)]
        await read_without_ack(streams_redis, "router-0", expected=4)
        await streams_redis.xdel(SCAN.stream_for(job), ids[1], ids[2])

        # Same consumer name, as a restarted pod: its own pending entries come first.
        worker = await workers.start(EVENT_ROUTER_CONSUMER_NAME="router-0")

        await eventually(lambda: subscriber.seqs(job) == [1, 4], what="the surviving entries")
        await eventually(lambda: _nothing_pending(streams_redis), what="every entry acked")
        trimmed = await worker.metric("event_router_trimmed_before_ack_total", domain="scan")
        assert trimmed == 2
        assert await dead_letters(streams_redis) == []


async def delete_stream(redis: Redis, stream: str) -> None:
    await redis.delete(stream)


async def destroy_group(redis: Redis, stream: str) -> None:
    await redis.xgroup_destroy(stream, GROUP)


LoseGroup = Callable[[Redis, str], Awaitable[None]]


class TestLostGroup:
    @pytest.mark.parametrize("lose", [delete_stream, destroy_group], ids=["DEL", "DESTROY"])
    async def test_entries_added_after_the_group_vanished_are_still_routed(
        self, lose: LoseGroup, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        worker = await workers.start()
        job = "scan-regrouped"
        await add_event(streams_redis, job, 1)
        await eventually(lambda: subscriber.seqs(job) == [1], what="first event routed")

        await lose(streams_redis, SCAN.stream_for(job))
        await add_event(streams_redis, job, 2)
        await add_event(streams_redis, job, 3)

        await eventually(lambda: subscriber.seqs(job)[-2:] == [2, 3], what="later events routed")
        assert await eventually(lambda: _nothing_pending(streams_redis), what="all acked")
        state = await job_state(streams_redis, job)
        assert state is not None
        assert state["seq"] == 3
        errors = [line for line in worker.log().splitlines() if " ERROR " in line]
        assert len(errors) == 1
        assert "consumer group on scan:events:" in errors[0]


class TestServerOutages:
    async def test_events_added_while_pubsub_is_down_are_all_published_after_it_restarts(
        self,
        workers: Workers,
        subscriber: PubSubCollector,
        streams_redis: Redis,
        pubsub_server: RedisServer,
    ) -> None:
        # The worker reaches Pub/Sub through a gate, so the test's subscriber is back on the
        # restarted server before the worker can publish there.
        async with TcpRelay(pubsub_server.port) as gate:
            worker = await workers.start(pubsub_url=gate.url)
            await add_event(streams_redis, "scan-before", 1)
            await eventually(lambda: subscriber.seqs("scan-before") == [1], what="warm-up")

            await asyncio.to_thread(pubsub_server.stop)
            gate.set_mode(Mode.HANG_UP)
            jobs = [job_in_shard(SCAN, 1, f"scan-outage-{n}") for n in range(4)]
            await _produce(streams_redis, jobs, range(1, 11), transaction=True)
            await eventually(lambda: _pending_is(streams_redis, 40), what="the batch held unacked")
            await eventually(
                lambda: _at_least(worker.metric("event_router_publish_errors_total"), 80),
                what="the held batch retried",
            )
            await asyncio.to_thread(pubsub_server.restart)
            await subscriber.until_subscribed(2)
            gate.set_mode(Mode.PASS)

            await eventually(
                lambda: all(_deduplicated(subscriber.seqs(j)) == list(range(1, 11)) for j in jobs),
                what="every event of the outage published",
            )
            assert await eventually(lambda: _nothing_pending(streams_redis), what="all acked")
            for job in jobs:
                state = await job_state(streams_redis, job)
                assert state is not None
                assert state["seq"] == 10

    async def test_a_streams_server_restarted_under_load_loses_no_event(
        self, workers: Workers, subscriber: PubSubCollector, pubsub_redis: Redis
    ) -> None:
        jobs = [job_in_shard(SCAN, 0, f"scan-durable-{n}") for n in range(5)]
        expected = {(job, seq) for job in jobs for seq in range(1, 121)}
        with RedisServer(appendonly=True) as streams:
            await workers.start(streams_url=streams.url, EVENT_ROUTER_READ_COUNT="250")
            first = Redis.from_url(streams.url)
            try:
                await _produce(first, jobs, range(1, 41))
                await eventually(lambda: len(subscriber.messages) >= 200, what="first 200 routed")
                # Paused Pub/Sub writes keep a batch applied but unpublished and unacked while
                # the streams server goes down and comes back.
                await pubsub_redis.client_pause(10_000, all=False)
                try:
                    await _produce(first, jobs, range(41, 81), transaction=True)
                    await eventually(lambda: _pending_is(first, 200), what="a batch in flight")
                    await asyncio.to_thread(streams.restart)
                finally:
                    await pubsub_redis.client_unpause()
            finally:
                await first.aclose()

            second = Redis.from_url(streams.url)
            try:
                await _produce(second, jobs, range(81, 121))
                await eventually(
                    lambda: subscriber.received_keys() >= expected, what="every event published"
                )
                assert await eventually(lambda: _nothing_pending(second), what="all acked")
                for job in jobs:
                    state = await job_state(second, job)
                    assert state is not None
                    assert state["seq"] == 120
                assert subscriber.received_keys() == expected
            finally:
                await second.aclose()


async def _produce(
    redis: Redis, jobs: list[str], seqs: range, *, transaction: bool = False
) -> None:
    """XADD `seqs` of every job; in one transaction, a blocked reader wakes to all of them."""
    async with redis.pipeline(transaction=transaction) as pipe:
        for seq in seqs:
            for job in jobs:
                pipe.xadd(SCAN.stream_for(job), {"job_id": job, "seq": seq})
        await pipe.execute()


async def _at_least(value: Awaitable[float], minimum: float) -> bool:
    return await value >= minimum


async def _pending_is(redis: Redis, count: int) -> bool:
    return await pending_count(redis) == count


def _deduplicated(seqs: list[int]) -> list[int]:
    """Seqs in first-arrival order; a redelivered entry may be published twice, never lost."""
    return list(dict.fromkeys(seqs))


async def _nothing_pending(redis: Redis) -> bool:
    return await pending_count(redis) == 0


async def _pending_of(redis: Redis, name: str, count: int) -> bool:
    return (await pending_by_consumer(redis)).get(name) == count
