"""End to end on Redis Sentinel and on Redis Cluster: the producer SDK, a worker process and
a gateway process (`serve --no-router`) on the same URLs a deployment would set, and an SSE
client, with duplicates, late events and a malformed entry in the streams."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from eco_router.adapters.redis.connections.connection import RedisClient, async_redis_client
from eco_router.domain.progress import StageEvent
from eco_router.domain.streams import StreamFamily
from eco_router.producer import AsyncStreamPublisher, connect_async, producer_config
from eco_router.testing import ClusterGroup, SentinelGroup
from tests.integration.sse_client import open_sse, sse_client
from tests.integration.support import Workers, eventually, worker_env
from tests.integration.test_cli import eco_router
from tests.integration.test_gateway import (
    STEPS,
    Gateway,
    Gateways,
    events_path,
    ids_and_names,
    new_job,
    publish,
)
from tests.integration.topology_fixtures import Shared

PRODUCER = producer_config(domain="scan", shards=4)


@pytest.fixture(params=["sentinel", "cluster"])
def topology_url(request: pytest.FixtureRequest) -> str:
    """The URL of a healthy, empty Sentinel group or Redis Cluster, for both roles."""
    group: SentinelGroup | ClusterGroup = request.getfixturevalue(
        "sentinel_group" if request.param == "sentinel" else "redis_cluster"
    )
    return group.url


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    launcher = Gateways(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
def workers(tmp_path: Path, topology_url: str) -> Iterator[Workers]:
    launcher = Workers(tmp_path, streams_url=topology_url, pubsub_url=topology_url)
    yield launcher
    launcher.kill_all()


@pytest.fixture
async def redis(topology_url: str) -> AsyncIterator[RedisClient]:
    client = async_redis_client(topology_url)
    yield client
    await client.aclose()


@pytest.fixture
def publisher(topology_url: str) -> AsyncStreamPublisher:
    return connect_async(topology_url, PRODUCER)


class TestEndToEnd:
    async def test_each_event_reaches_the_browser_once_in_order_and_bad_entries_are_set_aside(
        self,
        topology_url: str,
        workers: Workers,
        gateways: Gateways,
        redis: RedisClient,
        publisher: AsyncStreamPublisher,
    ) -> None:
        await workers.start()
        gateway: Gateway = await asyncio.to_thread(
            lambda: gateways.start(
                streams_url=topology_url, pubsub_url=topology_url, no_router=True
            )
        )
        job = new_job("topology")
        config = publisher.config
        family: StreamFamily = config.family
        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as stream:
            [snapshot] = await stream.read(1)
            await publish(publisher, job, 0, 10, 11)
            # The same event appended again (a producer that retried past its idempotency
            # window), a late one (seq 10 after 11) and an entry that is no event at all.
            again = config.stage_event(StageEvent(job, *STEPS[11]))
            late = config.stage_event(StageEvent(job, *STEPS[10]))
            await redis.xadd(again.stream, dict(again.fields))  # type: ignore[arg-type]
            await redis.xadd(late.stream, dict(late.fields))  # type: ignore[arg-type]
            await redis.xadd(family.stream_for(job), {"job_id": job, "seq": "not a number"})
            await publish(publisher, job, 20, 21, 30, 31, 51)
            events = await stream.read_to_end()

        assert snapshot.event == "snapshot"
        assert ids_and_names(events) == [
            ("0", "queued"),
            ("10", "vision"),
            ("11", "vision"),
            ("20", "rule"),
            ("21", "rule"),
            ("30", "answer"),
            ("31", "answer"),
            ("51", "done"),
        ]

        async def dead_lettered() -> bool:
            return await redis.xlen(family.dead_letter_stream) == 1

        await eventually(dead_lettered, what="the malformed entry dead-lettered")
        env = worker_env(topology_url, topology_url)
        shown = await eco_router(env, "state", "--json", "--domain", "scan", job)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert json.loads(shown.stdout)["state"]["seq"] == 51


class TestPlacementOnTheCluster:
    async def test_status_and_the_start_log_name_each_shards_master_and_they_balance(
        self, redis_cluster: ClusterGroup, tmp_path: Path
    ) -> None:
        url = redis_cluster.url
        workers = Workers(tmp_path, streams_url=url, pubsub_url=url)
        try:
            worker = await workers.start(EVENT_ROUTER_STREAMS="scan:events=4")
            env = worker_env(url, url, EVENT_ROUTER_STREAMS="scan:events=4")
            shown = await eco_router(env, "status", "--json")
        finally:
            workers.kill_all()

        assert shown.returncode == 0, shown.stderr
        shards = json.loads(shown.stdout)["shards"]
        masters = {f"127.0.0.1:{m.master.port}" for m in redis_cluster.masters()}
        per_master = Counter(s["node"] for s in shards)
        assert set(per_master) <= masters
        assert all(abs(per_master[m] - len(shards) / 3) <= 1 for m in masters), per_master
        for shard in shards:
            slot = redis_cluster.slot_for_key(shard["stream"])
            assert redis_cluster.master_for_slot(slot).port == int(shard["node"].split(":")[1])
        assert re.search(
            r"shards on the cluster: scan:events:\{\d+\}:0 on 127\.0\.0\.1:\d+", worker.log()
        )


class TestNoMasterReachable:
    async def test_readiness_says_so_and_routing_resumes_when_the_master_is_back(
        self, sentinel_group: SentinelGroup, shared_sentinel: Shared[SentinelGroup], tmp_path: Path
    ) -> None:
        url = sentinel_group.url
        workers = Workers(tmp_path, streams_url=url, pubsub_url=url)
        publisher = connect_async(url, PRODUCER)
        try:
            worker = await workers.start()
            shared_sentinel.broken = True
            data_nodes = sentinel_group.servers
            for server in data_nodes:
                server.stop()

            async def unready() -> str | None:
                response = await worker.get("/ready")
                return response.text if response.status_code == 503 else None

            checks = json.loads(await eventually(unready, what="the worker unready"))["checks"]
            # The sentinels still name the dead master: nothing answers at its address.
            assert checks["streams"].startswith("unreachable: PING streams server"), checks
            assert checks["pubsub"].startswith("unreachable: PING Pub/Sub server"), checks

            for server in data_nodes:
                server.start()

            async def ready() -> bool:
                return (await worker.get("/ready")).status_code == 200

            await eventually(ready, timeout_s=30, what="the worker ready again")
            client = async_redis_client(url)
            try:
                job = new_job("back")
                await publish(publisher, job, 0)
                state = await eventually(lambda: client.get(f"scan:state:{job}"), timeout_s=30)
                assert json.loads(state)["seq"] == 0
            finally:
                await client.aclose()
        finally:
            workers.kill_all()
