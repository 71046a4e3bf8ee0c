"""The token API on a real redis-server: the entries as the router reads them, one pipeline
for entries ready together, and no second entry when a round trip is retried."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis

from eco_router.adapters.redis.connections.connection import async_redis_client
from eco_router.producer import (
    AsyncStreamPublisher,
    InvalidProgressEvent,
    StreamPublisher,
    TokensPublished,
    connect,
    connect_async,
    producer_config,
)
from eco_router.testing import ClusterGroup, RedisServer, SentinelGroup
from tests.integration.support import eventually
from tests.tcp_relay import Mode, TcpRelay

CONFIG = producer_config(domain="chat", shards=4)
JOB = "chat-job-7"
ANSWER = ["안녕하세요", "! ", "Here is ", "your answer ", "🚀", "."]

PublishTokens = Callable[..., Awaitable[TokensPublished]]


def md5_stream(job_id: str, shards: int = 4) -> str:
    """The job's stream by the documented rule, computed apart from the code under test."""
    digest = hashlib.md5(job_id.encode()).digest()
    return f"chat:events:{int.from_bytes(digest[:8], 'big') % shards}"


async def entries(client: Redis, job_id: str = JOB) -> list[dict[str, str]]:
    """The job's entries (not its shard's others) with their fields decoded, in stream order,
    field order kept."""
    return [
        {name.decode(): value.decode() for name, value in fields.items()}
        for _, fields in await client.xrange(md5_stream(job_id))
        if fields[b"job_id"] == job_id.encode()
    ]


@pytest.fixture
def sync_client(streams_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(streams_server.url)
    yield client
    client.close()


@pytest.fixture(params=["sync", "async"])
def publish_tokens(
    request: pytest.FixtureRequest, sync_client: redis.Redis, streams_redis: Redis
) -> PublishTokens:
    """`publish_tokens` of either publisher (the sync one in a thread), awaitable in both."""
    if request.param == "async":
        return AsyncStreamPublisher(streams_redis, CONFIG).publish_tokens
    publisher = StreamPublisher(sync_client, CONFIG)

    async def via_thread(*args: Any, **kwargs: Any) -> TokensPublished:
        return await asyncio.to_thread(publisher.publish_tokens, *args, **kwargs)

    return via_thread


class TestTheWrittenEntries:
    async def test_each_entry_has_exactly_the_token_fields_in_order(
        self, publish_tokens: PublishTokens, streams_redis: Redis
    ) -> None:
        await publish_tokens(JOB, ANSWER, node="answer", coalesce_ms=0)

        written = await entries(streams_redis)
        assert [list(entry) for entry in written] == [
            ["job_id", "stage", "status", "seq", "ts", "content", "node"]
        ] * len(ANSWER)
        assert [
            (e["job_id"], e["stage"], e["status"], e["seq"], e["content"], e["node"])
            for e in written
        ] == [
            (JOB, "token", "streaming", str(1001 + n), delta, "answer")
            for n, delta in enumerate(ANSWER)
        ]
        assert all(re.fullmatch(r"[0-9]{10}\.[0-9]{3}", e["ts"]) for e in written)

    async def test_a_batch_sent_after_the_servers_scripts_were_flushed_is_written_once(
        self, publish_tokens: PublishTokens, streams_redis: Redis
    ) -> None:
        await publish_tokens("chat-job-warm", ["warm"], coalesce_ms=0)
        await streams_redis.script_flush()

        published = await publish_tokens(JOB, ANSWER, coalesce_ms=0)

        assert [e["content"] for e in await entries(streams_redis)] == ANSWER
        assert published.entries == len(ANSWER)

    async def test_a_retried_attempt_writes_its_number_and_no_node_is_left_out(
        self, publish_tokens: PublishTokens, streams_redis: Redis
    ) -> None:
        await publish_tokens(JOB, ["again"], attempt=3)

        [entry] = await entries(streams_redis)
        assert list(entry) == ["job_id", "stage", "status", "seq", "ts", "content", "attempt"]
        assert (entry["seq"], entry["attempt"]) == ("1001", "3")

    async def test_text_in_any_script_arrives_as_utf8_byte_for_byte(
        self, publish_tokens: PublishTokens, streams_redis: Redis
    ) -> None:
        deltas = ["줄\n바꿈", ' "quoted" ', "\t", "👩‍👩‍👧", "é"]

        await publish_tokens(JOB, deltas, coalesce_ms=0)

        [*fields] = await streams_redis.xrange(md5_stream(JOB))
        assert [f[b"content"] for _, f in fields] == [d.encode() for d in deltas]

    async def test_merged_deltas_are_one_entry_on_the_jobs_shard_only(
        self, publish_tokens: PublishTokens, streams_redis: Redis
    ) -> None:
        published = await publish_tokens(JOB, ANSWER, coalesce_ms=60_000)

        assert [e["content"] for e in await entries(streams_redis)] == ["".join(ANSWER)]
        assert (published.entries, published.last_seq) == (1, 1001)
        for stream in CONFIG.family.streams:
            if stream != md5_stream(JOB):
                assert await streams_redis.exists(stream) == 0

    async def test_the_stream_is_trimmed_like_stage_events(self, sync_client: redis.Redis) -> None:
        publisher = StreamPublisher(
            sync_client, producer_config(domain="chat", shards=1, maxlen=50)
        )

        publisher.publish_tokens(JOB, [f"t{n}" for n in range(1_000)], coalesce_ms=0)

        assert 50 <= sync_client.xlen("chat:events:0") <= 300


class TestIdempotency:
    async def test_the_same_run_again_writes_no_second_entry(
        self, publish_tokens: PublishTokens, streams_redis: Redis
    ) -> None:
        await publish_tokens(JOB, ANSWER, coalesce_ms=0)
        await publish_tokens(JOB, ANSWER, coalesce_ms=0)

        assert [e["content"] for e in await entries(streams_redis)] == ANSWER

    async def test_each_tokens_marker_holds_its_first_entry_id(self, streams_redis: Redis) -> None:
        publisher = AsyncStreamPublisher(streams_redis, CONFIG)

        entry_id = await publisher.publish_token(JOB, "hi", seq=1007, attempt=2)
        again = await publisher.publish_token(JOB, "hi", seq=1007, attempt=2)

        assert again == entry_id
        marker = f"{{{md5_stream(JOB)}}}:once:{len(JOB)}:{JOB}:token:2:1007"
        assert (await streams_redis.get(marker)).decode() == entry_id
        assert 0 < await streams_redis.ttl(marker) <= CONFIG.idempotency_ttl_s

    def test_the_synchronous_single_token_is_idempotent_too(self, sync_client: redis.Redis) -> None:
        publisher = StreamPublisher(sync_client, CONFIG)

        first = publisher.publish_token(JOB, "hi", seq=1001, node="answer")

        assert publisher.publish_token(JOB, "hi", seq=1001, node="answer") == first
        assert sync_client.xlen(md5_stream(JOB)) == 1

    @pytest.mark.parametrize("kind", ["sync", "async"])
    async def test_a_pipeline_retried_after_its_reply_was_lost_adds_no_entry(
        self, kind: str, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        async with TcpRelay(streams_server.port, slow_delay_s=2.0) as relay:
            if kind == "async":
                client = async_redis_client(relay.url)
                publisher: Any = AsyncStreamPublisher(client, CONFIG)
            else:
                client = redis.Redis.from_url(relay.url)
                publisher = StreamPublisher(client, CONFIG)

            async def publish(*args: Any, **kwargs: Any) -> Any:
                if kind == "async":
                    return await publisher.publish_tokens(*args, **kwargs)
                return await asyncio.to_thread(publisher.publish_tokens, *args, **kwargs)

            try:
                # Connected and the script loaded at full speed; then replies crawl.
                await publish("warm-up", ["x"])
                relay.set_mode(Mode.SLOW)
                run = asyncio.create_task(publish(JOB, ANSWER, coalesce_ms=0))

                # Every entry is in: the pipeline ran; its reply is held in the relay.
                async def all_in() -> bool:
                    return len(await entries(streams_redis)) == len(ANSWER)

                await eventually(
                    all_in,
                    timeout_s=10,
                    every_s=0.02,
                    what="the pipeline's entries",
                )
                relay.set_mode(Mode.CUT)
                relay.set_mode(Mode.PASS)
                published = await asyncio.wait_for(run, 30)
            finally:
                closing = client.aclose() if kind == "async" else asyncio.to_thread(client.close)
                await closing

        assert relay.reset >= 1
        assert published.entries == len(ANSWER)
        assert [e["content"] for e in await entries(streams_redis)] == ANSWER


class TestRoundTrips:
    async def test_entries_ready_together_go_in_one_round_trip(
        self, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        # Each chunk the relay forwards waits 0.3 s: a round trip per entry would take 30 s.
        async with TcpRelay(streams_server.port, slow_delay_s=0.3) as relay:
            client = async_redis_client(relay.url)
            try:
                publisher = AsyncStreamPublisher(client, CONFIG)
                await publisher.publish_tokens("warm-up", ["x"])
                relay.set_mode(Mode.SLOW)
                started = asyncio.get_running_loop().time()

                await publisher.publish_tokens(JOB, [f"t{n} " for n in range(100)], coalesce_ms=0)

                elapsed = asyncio.get_running_loop().time() - started
            finally:
                await client.aclose()

        assert len(await entries(streams_redis)) == 100
        assert elapsed < 5, f"{elapsed:.1f} s: the entries did not share a round trip"

    async def test_a_model_slower_than_the_window_has_its_text_written_as_it_comes(
        self, streams_redis: Redis
    ) -> None:
        publisher = AsyncStreamPublisher(streams_redis, CONFIG)
        seen: list[int] = []

        async def model() -> AsyncIterator[str]:
            for delta in ANSWER:
                yield delta
                await asyncio.sleep(0.15)  # three windows of 50 ms
                seen.append(await streams_redis.xlen(md5_stream(JOB)))

        await publisher.publish_tokens(JOB, model())

        assert seen == list(range(1, len(ANSWER) + 1))


class TestRefusals:
    async def test_a_refused_run_leaves_the_database_empty(
        self, publish_tokens: PublishTokens, streams_redis: Redis
    ) -> None:
        for bad in ({"node": "a b"}, {"attempt": -1}, {"coalesce_ms": -1}):
            with pytest.raises(InvalidProgressEvent):
                await publish_tokens(JOB, ANSWER, **bad)

        assert await streams_redis.dbsize() == 0


@pytest.fixture(params=["sentinel", "cluster"])
def topology(request: pytest.FixtureRequest) -> SentinelGroup | ClusterGroup:
    group: SentinelGroup | ClusterGroup = request.getfixturevalue(
        "sentinel_group" if request.param == "sentinel" else "redis_cluster"
    )
    return group


class TestReplicatedTopologies:
    async def test_a_batch_returns_once_a_replica_has_it_on_sentinel_and_cluster(
        self, topology: SentinelGroup | ClusterGroup
    ) -> None:
        config = producer_config(domain="chat", shards=4, wait_replicas=1, wait_timeout_ms=2000)
        publisher = connect_async(topology.url, config)
        client = async_redis_client(topology.url)
        try:
            published = await publisher.publish_tokens(JOB, ANSWER, coalesce_ms=0)
            stream = publisher.config.family.stream_for(JOB)
            written = [f[b"content"].decode() for _, f in await client.xrange(stream)]
        finally:
            await client.aclose()

        assert published.entries == len(ANSWER)
        assert written == ANSWER

    async def test_the_synchronous_publisher_batches_on_them_too(
        self, topology: SentinelGroup | ClusterGroup
    ) -> None:
        config = producer_config(domain="chat", shards=4, wait_replicas=1, wait_timeout_ms=2000)
        publisher = connect(topology.url, config)

        published = await asyncio.to_thread(publisher.publish_tokens, JOB, ANSWER, coalesce_ms=0)

        assert published.last_seq == 1000 + len(ANSWER)
