"""The worker reports how many jobs' records it holds, up to EVENT_ROUTER_HELD_JOBS."""

from __future__ import annotations

from redis.asyncio import Redis

from tests.integration.support import PubSubCollector, Workers, add_event, eventually

JOBS = ("held-a", "held-b", "held-c")


class TestHeldJobs:
    async def test_the_jobs_routed_are_held_and_counted(
        self, workers: Workers, streams_redis: Redis, subscriber: PubSubCollector
    ) -> None:
        worker = await workers.start()
        for job in JOBS:
            await add_event(streams_redis, job, 0)
        await eventually(lambda: all(subscriber.seqs(j) == [0] for j in JOBS), what="routed")

        assert await worker.metric_reaching("event_router_held_jobs", len(JOBS)) == len(JOBS)

    async def test_no_more_are_held_than_the_bound(
        self, workers: Workers, streams_redis: Redis, subscriber: PubSubCollector
    ) -> None:
        worker = await workers.start(EVENT_ROUTER_HELD_JOBS="1")
        for job in JOBS:
            await add_event(streams_redis, job, 0)
            await eventually(lambda job=job: subscriber.seqs(job) == [0], what=f"{job} routed")

        assert await worker.metric("event_router_held_jobs") == 1
