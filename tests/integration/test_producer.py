"""The producer SDK on a real redis-server: fields, shards, idempotency, trimming, routing."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
import redis
from redis.asyncio import Redis

from eco_router.producer import (
    AsyncStreamPublisher,
    InvalidProgressEvent,
    StreamPublisher,
    connect,
    producer_config,
)
from eco_router.testing import RedisServer
from tests.integration.support import PubSubCollector, Workers, eventually

CONFIG = producer_config(domain="scan", shards=4)
RESULT = {"label": "chat noir 🐈", "score": 0.93, "notes": ["ça va", None]}
RACERS = 20

Publish = Callable[..., Awaitable[str]]


def md5_stream(job_id: str, shards: int = 4, prefix: str = "scan:events") -> str:
    """The job's stream by the documented rule, computed independently of the code under test."""
    digest = hashlib.md5(job_id.encode()).digest()
    return f"{prefix}:{int.from_bytes(digest[:8], 'big') % shards}"


@pytest.fixture
def sync_client(streams_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(streams_server.url)
    yield client
    client.close()


@pytest.fixture
def sync_publisher(sync_client: redis.Redis) -> StreamPublisher:
    return StreamPublisher(sync_client, CONFIG)


@pytest.fixture
def async_publisher(streams_redis: Redis) -> AsyncStreamPublisher:
    return AsyncStreamPublisher(streams_redis, CONFIG)


@pytest.fixture(params=["sync", "async"])
def publish(
    request: pytest.FixtureRequest,
    sync_publisher: StreamPublisher,
    async_publisher: AsyncStreamPublisher,
) -> Publish:
    """`publish_stage_event` of either publisher, awaitable in both cases."""
    if request.param == "async":
        return async_publisher.publish_stage_event

    async def via_thread(*args: Any, **kwargs: Any) -> str:
        return await asyncio.to_thread(sync_publisher.publish_stage_event, *args, **kwargs)

    return via_thread


async def entries(client: Redis, stream: str) -> list[tuple[str, dict[bytes, bytes]]]:
    return [(entry_id.decode(), fields) for entry_id, fields in await client.xrange(stream)]


class TestTheWrittenEntry:
    async def test_the_fields_land_on_the_md5_shard_of_the_job(
        self, publish: Publish, streams_redis: Redis
    ) -> None:
        entry_id = await publish("job-7", "done", "done", progress=100, result=RESULT)

        stream = md5_stream("job-7")
        [(found_id, fields)] = await entries(streams_redis, stream)
        assert found_id == entry_id
        assert {k: v for k, v in fields.items() if k != b"ts"} == {
            b"job_id": b"job-7",
            b"stage": b"done",
            b"status": b"done",
            b"seq": b"51",
            b"progress": b"100",
            b"result": orjson.dumps(RESULT),
        }
        assert float(fields[b"ts"]) > 0
        for other in CONFIG.family.streams:
            if other != stream:
                assert await streams_redis.exists(other) == 0

    async def test_non_ascii_in_the_result_is_written_as_utf8_not_escaped(
        self, publish: Publish, streams_redis: Redis
    ) -> None:
        await publish("job-7", "vision", "completed", result={"text": "ça, 猫, 🐈"})

        [(_, fields)] = await entries(streams_redis, md5_stream("job-7"))
        assert "ça, 猫, 🐈".encode() in fields[b"result"]
        assert b"\\u" not in fields[b"result"]

    async def test_an_explicit_seq_and_a_custom_stage_are_written_as_given(
        self, publish: Publish, streams_redis: Redis
    ) -> None:
        await publish("job-7", "upload", "started", seq=5)

        [(_, fields)] = await entries(streams_redis, md5_stream("job-7"))
        assert (fields[b"stage"], fields[b"seq"]) == (b"upload", b"5")
        assert b"progress" not in fields
        assert b"result" not in fields

    def test_the_public_connect_gives_a_working_sync_publisher(
        self, streams_server: RedisServer, sync_client: redis.Redis
    ) -> None:
        publisher = connect(streams_server.url, producer_config(domain="chat", shards=2))

        entry_id = publisher.publish_stage_event("job-7", "vision", "started")

        stream = md5_stream("job-7", 2, "chat:events")
        assert [i.decode() for i, _ in sync_client.xrange(stream)] == [entry_id]


class TestIdempotency:
    async def test_the_same_event_twice_returns_the_first_id_and_adds_one_entry(
        self, publish: Publish, streams_redis: Redis
    ) -> None:
        first = await publish("job-7", "rule", "completed", progress=40)
        again = await publish("job-7", "rule", "completed", progress=45)

        assert again == first
        [(found_id, fields)] = await entries(streams_redis, md5_stream("job-7"))
        assert (found_id, fields[b"progress"]) == (first, b"40")

    async def test_the_marker_holds_the_first_id_for_the_idempotency_window(
        self, publish: Publish, streams_redis: Redis
    ) -> None:
        entry_id = await publish("job-7", "rule", "started")

        marker = f"{{{md5_stream('job-7')}}}:once:5:job-7:rule:started"
        assert (await streams_redis.get(marker)).decode() == entry_id
        assert 0 < await streams_redis.ttl(marker) <= CONFIG.idempotency_ttl_s

    async def test_another_status_of_the_same_stage_is_another_entry(
        self, publish: Publish, streams_redis: Redis
    ) -> None:
        started = await publish("job-7", "rule", "started")
        failed = await publish("job-7", "rule", "failed")

        assert started != failed
        assert [i for i, _ in await entries(streams_redis, md5_stream("job-7"))] == [
            started,
            failed,
        ]

    def test_racing_sync_publishers_add_one_entry_and_agree_on_its_id(
        self, streams_server: RedisServer, sync_client: redis.Redis
    ) -> None:
        clients = [redis.Redis.from_url(streams_server.url) for _ in range(RACERS)]
        publishers = [StreamPublisher(client, CONFIG) for client in clients]
        barrier = threading.Barrier(RACERS)

        def race(publisher: StreamPublisher) -> str:
            barrier.wait(timeout=10)
            return publisher.publish_stage_event("job-race", "answer", "completed", progress=75)

        try:
            with ThreadPoolExecutor(RACERS) as pool:
                ids = list(pool.map(race, publishers))
        finally:
            for client in clients:
                client.close()

        assert len(set(ids)) == 1
        assert sync_client.xlen(md5_stream("job-race")) == 1
        assert sync_client.xrange(md5_stream("job-race"))[0][0].decode() == ids[0]

    async def test_racing_async_publishers_add_one_entry_and_agree_on_its_id(
        self, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        clients = [Redis.from_url(streams_server.url) for _ in range(RACERS)]
        try:
            ids = await asyncio.gather(
                *(
                    AsyncStreamPublisher(client, CONFIG).publish_stage_event(
                        "job-race", "answer", "completed", progress=75
                    )
                    for client in clients
                )
            )
        finally:
            await asyncio.gather(*(client.aclose() for client in clients))

        assert len(set(ids)) == 1
        assert [i for i, _ in await entries(streams_redis, md5_stream("job-race"))] == [ids[0]]


class TestTrimming:
    def test_the_stream_is_trimmed_approximately_to_maxlen(self, sync_client: redis.Redis) -> None:
        config = producer_config(domain="scan", shards=1, maxlen=100)
        publisher = StreamPublisher(sync_client, config)

        for n in range(1_000):
            publisher.publish_stage_event(f"job-{n}", "vision", "started")

        length = sync_client.xlen("scan:events:0")
        assert 100 <= length <= 300


BAD_CALLS: dict[str, tuple[tuple[str, str, str], dict[str, Any]]] = {
    "empty-job-id": (("", "vision", "started"), {}),
    "129-char-job-id": (("j" * 129, "vision", "started"), {}),
    "space-in-job-id": (("job 7", "vision", "started"), {}),
    "brace-in-job-id": (("job{7}", "vision", "started"), {}),
    "star-in-job-id": (("job*", "vision", "started"), {}),
    "unknown-status": (("job-7", "vision", "running"), {}),
    "stage-outside-plan": (("job-7", "upload", "started"), {}),
    "progress-negative": (("job-7", "vision", "started"), {"progress": -1}),
    "progress-101": (("job-7", "vision", "started"), {"progress": 101}),
    "progress-float": (("job-7", "vision", "started"), {"progress": 5.5}),
    "progress-bool": (("job-7", "vision", "started"), {"progress": True}),
    "nan-result": (("job-7", "done", "done"), {"result": float("nan")}),
    "nested-nan-result": (("job-7", "done", "done"), {"result": {"score": float("nan")}}),
    "object-result": (("job-7", "done", "done"), {"result": object()}),
    "set-result": (("job-7", "done", "done"), {"result": {1, 2}}),
}


class TestBadInputWritesNothing:
    @pytest.mark.parametrize(("args", "kwargs"), BAD_CALLS.values(), ids=BAD_CALLS.keys())
    async def test_a_refused_call_leaves_the_database_empty(
        self,
        publish: Publish,
        streams_redis: Redis,
        args: tuple[str, str, str],
        kwargs: dict[str, Any],
    ) -> None:
        with pytest.raises(InvalidProgressEvent):
            await publish(*args, **kwargs)

        assert await streams_redis.dbsize() == 0


PIPELINE = [
    ("queued", "queued", {"progress": 0}),
    ("vision", "started", {"progress": 5}),
    ("vision", "completed", {"progress": 20}),
    ("rule", "started", {}),
    ("rule", "completed", {"progress": 40}),
    ("answer", "started", {}),
    ("answer", "failed", {"result": {"error": "réponse vide"}}),
]


class TestEndToEnd:
    async def test_events_of_both_publishers_reach_the_job_channel_in_seq_order(
        self,
        workers: Workers,
        subscriber: PubSubCollector,
        sync_publisher: StreamPublisher,
        async_publisher: AsyncStreamPublisher,
    ) -> None:
        await workers.start()
        ids: dict[str, list[str]] = {"mixed-1": [], "async-2": []}

        for n, (stage, status, extra) in enumerate(PIPELINE):
            # mixed-1 alternates publishers, as a job whose stages run in different workers.
            if n % 2 == 0:
                ids["mixed-1"].append(
                    await asyncio.to_thread(
                        sync_publisher.publish_stage_event, "mixed-1", stage, status, **extra
                    )
                )
            else:
                ids["mixed-1"].append(
                    await async_publisher.publish_stage_event("mixed-1", stage, status, **extra)
                )
            ids["async-2"].append(
                await async_publisher.publish_stage_event("async-2", stage, status, **extra)
            )
        # A retried call adds nothing, so nothing more is routed.
        await async_publisher.publish_stage_event("async-2", "queued", "queued", progress=0)

        expected_seqs = [0, 10, 11, 20, 21, 30, 32]
        for job_id in ids:
            await eventually(
                lambda job_id=job_id: len(subscriber.for_job(job_id)) >= len(PIPELINE),
                what=f"{job_id} routed",
            )
            received = subscriber.for_job(job_id)
            assert subscriber.seqs(job_id) == expected_seqs
            assert [p["stream_id"] for p in received] == ids[job_id]
            assert [(p["stage"], p["status"]) for p in received] == [
                (stage, status) for stage, status, _ in PIPELINE
            ]
            assert received[-1]["result"] == {"error": "réponse vide"}
            assert {p["domain"] for p in received} == {"scan"}
        assert len(subscriber.messages) == 2 * len(PIPELINE)
