"""`publish_stage_event(redis_client, ...)`, the reference design's call, on a real server:
its default layout, its overrides by keyword and environment, its errors, its publishers."""

from __future__ import annotations

import gc
import hashlib
import weakref
from collections.abc import Iterator

import orjson
import pytest
import redis
import redis.cluster
from redis.asyncio import Redis

from eco_router import producer
from eco_router.producer import (
    InvalidProgressEvent,
    producer_config,
    publish_stage_event,
    publish_stage_event_async,
)
from eco_router.testing import ClusterGroup, RedisServer

VARIABLES = ("EVENT_ROUTER_PRODUCER_DOMAIN", "EVENT_ROUTER_PRODUCER_SHARDS", "SSE_SHARD_COUNT")
JOB = "0b0e3c2e-5a1d-4c43-9d3a-2f1f0f6b7c11"


def md5_stream(job_id: str, shards: int = 4, prefix: str = "scan:events") -> str:
    """The reference design's `scan:events:{md5 % shards}`, written out independently."""
    digest = hashlib.md5(job_id.encode()).digest()
    return f"{prefix}:{int.from_bytes(digest[:8], 'big') % shards}"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def client(streams_server: RedisServer) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(streams_server.url)
    yield made
    made.close()


@pytest.fixture
def text_client(streams_server: RedisServer) -> Iterator[redis.Redis]:
    """A client as the reference design's workers make it (`decode_responses=True`)."""
    made = redis.Redis.from_url(streams_server.url, decode_responses=True)
    yield made
    made.close()


def entries(client: redis.Redis, stream: str) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()} for _, fields in client.xrange(stream)
    ]


class TestDefaults:
    def test_the_reference_layout_scan_with_four_md5_shards(self, client: redis.Redis) -> None:
        entry_id = publish_stage_event(client, JOB, "vision", "started", progress=0)

        assert isinstance(entry_id, str)
        [written] = client.xrange(md5_stream(JOB))
        assert written[0].decode() == entry_id
        assert entries(client, md5_stream(JOB))[0]["seq"] == "10"

    def test_positional_result_and_progress_as_the_reference_signature_has_them(
        self, client: redis.Redis
    ) -> None:
        publish_stage_event(client, JOB, "done", "completed", {"answer": "정상입니다"}, 100)

        [fields] = entries(client, md5_stream(JOB))
        assert (fields["stage"], fields["status"], fields["seq"]) == ("done", "completed", "51")
        assert orjson.loads(fields["result"]) == {"answer": "정상입니다"}
        assert fields["progress"] == "100"

    def test_keyword_call_sites_of_the_reference_design_work_unchanged(
        self, client: redis.Redis
    ) -> None:
        publish_stage_event(
            redis_client=client, job_id=JOB, stage="queued", status="started", progress=0
        )

        [fields] = entries(client, md5_stream(JOB))
        assert (fields["stage"], fields["seq"], fields["progress"]) == ("queued", "0", "0")

    def test_a_retried_call_returns_the_first_id_and_adds_nothing(
        self, client: redis.Redis
    ) -> None:
        first = publish_stage_event(client, JOB, "done", "completed", result={"a": 1})
        again = publish_stage_event(client, JOB, "done", "completed", result={"a": 1})
        other_spelling = publish_stage_event(client, JOB, "done", "done", result={"a": 1})

        assert first == again == other_spelling
        assert client.xlen(md5_stream(JOB)) == 1

    def test_a_text_client_gets_the_id_as_text_too(self, text_client: redis.Redis) -> None:
        entry_id = publish_stage_event(text_client, JOB, "rule", "completed", progress=50)

        assert isinstance(entry_id, str)
        assert text_client.xrange(md5_stream(JOB))[0][0] == entry_id

    def test_bad_input_is_refused_before_redis_is_touched(self) -> None:
        unreachable = redis.Redis(host="127.0.0.1", port=1)

        with pytest.raises(InvalidProgressEvent, match="progress 101"):
            publish_stage_event(unreachable, JOB, "vision", "started", progress=101)
        with pytest.raises(InvalidProgressEvent, match="'upload' is not in the plan"):
            publish_stage_event(unreachable, JOB, "upload", "started")


class TestOverrides:
    def test_domain_and_shards_by_keyword(self, client: redis.Redis) -> None:
        publish_stage_event(client, JOB, "vision", "started", domain="chat", shards=8)

        assert client.xlen(md5_stream(JOB, 8, "chat:events")) == 1

    def test_a_config_by_keyword(self, client: redis.Redis) -> None:
        config = producer_config(domain="ocr", shards=2, stages=("read", "check"))
        publish_stage_event(client, JOB, "check", "completed", config=config)

        assert entries(client, md5_stream(JOB, 2, "ocr:events"))[0]["seq"] == "21"

    def test_the_environment_names_domain_and_shards(
        self, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_PRODUCER_DOMAIN", "chat")
        monkeypatch.setenv("EVENT_ROUTER_PRODUCER_SHARDS", "16")
        publish_stage_event(client, JOB, "vision", "started")

        assert client.xlen(md5_stream(JOB, 16, "chat:events")) == 1

    def test_the_reference_shard_variable_is_read_when_ours_is_unset(
        self, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("SSE_SHARD_COUNT", "8")
        publish_stage_event(client, JOB, "vision", "started")
        monkeypatch.setenv("EVENT_ROUTER_PRODUCER_SHARDS", "2")
        publish_stage_event(client, JOB, "vision", "completed")

        assert client.xlen(md5_stream(JOB, 8)) == 1
        assert client.xlen(md5_stream(JOB, 2)) == 1

    def test_a_keyword_wins_over_the_environment(
        self, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_PRODUCER_DOMAIN", "chat")
        monkeypatch.setenv("EVENT_ROUTER_PRODUCER_SHARDS", "16")
        publish_stage_event(client, JOB, "vision", "started", domain="scan", shards=4)

        assert client.xlen(md5_stream(JOB)) == 1


class TestErrors:
    @pytest.mark.parametrize(
        ("variable", "value", "message"),
        [
            (
                "EVENT_ROUTER_PRODUCER_SHARDS",
                "four",
                "EVENT_ROUTER_PRODUCER_SHARDS='four' must be an integer from 1 to 1024",
            ),
            (
                "EVENT_ROUTER_PRODUCER_SHARDS",
                "0",
                "EVENT_ROUTER_PRODUCER_SHARDS='0' must be an integer from 1 to 1024",
            ),
            ("SSE_SHARD_COUNT", "-4", "SSE_SHARD_COUNT='-4' must be an integer from 1 to 1024"),
            (
                "EVENT_ROUTER_PRODUCER_DOMAIN",
                "scan:events",
                "EVENT_ROUTER_PRODUCER_DOMAIN='scan:events' must be 1-64 characters",
            ),
        ],
    )
    def test_a_bad_variable_is_named_in_one_line(
        self, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
    ) -> None:
        monkeypatch.setenv(variable, value)

        with pytest.raises(ValueError, match="^" + message.replace("[", r"\[")) as raised:
            publish_stage_event(redis.Redis(host="127.0.0.1", port=1), JOB, "vision", "started")
        assert "\n" not in str(raised.value)

    @pytest.mark.parametrize(
        ("keywords", "message"),
        [
            ({"shards": 0}, "shards=0 must be an integer from 1 to 1024"),
            ({"shards": True}, "shards=True must be an integer"),
            ({"domain": "a b"}, "domain='a b' must be 1-64 characters"),
            (
                {"domain": "scan", "config": producer_config()},
                "pass either config or domain/shards, not both",
            ),
        ],
    )
    def test_a_bad_keyword_is_named(self, keywords: dict[str, object], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            publish_stage_event(
                redis.Redis(host="127.0.0.1", port=1),
                JOB,
                "vision",
                "started",
                **keywords,  # type: ignore[arg-type]
            )


class TestPublishers:
    def test_one_publisher_per_client_and_layout_however_many_calls(
        self, client: redis.Redis, streams_server: RedisServer
    ) -> None:
        cache = producer._sync_publishers
        for progress in range(10):
            publish_stage_event(client, f"job-{progress}", "vision", "started", progress=progress)
        assert cache.count(client) == 1

        publish_stage_event(client, JOB, "vision", "started", shards=2)
        assert cache.count(client) == 2

    def test_a_dropped_client_takes_its_publishers_with_it(
        self, streams_server: RedisServer
    ) -> None:
        dropped = redis.Redis.from_url(streams_server.url)
        publish_stage_event(dropped, JOB, "rule", "started")
        gone = weakref.ref(dropped)

        dropped.close()
        del dropped
        gc.collect()
        assert gone() is None


class TestAsync:
    async def test_the_async_twin_writes_the_same_entry(self, streams_redis: Redis) -> None:
        entry_id = await publish_stage_event_async(
            streams_redis, JOB, "queued", "started", progress=0
        )
        again = await publish_stage_event_async(streams_redis, JOB, "queued", "started")

        assert entry_id == again
        [(found, fields)] = await streams_redis.xrange(md5_stream(JOB))
        assert found.decode() == entry_id
        assert fields[b"seq"] == b"0"

    async def test_the_async_twin_reads_the_same_environment(
        self, streams_redis: Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_PRODUCER_SHARDS", "3")
        await publish_stage_event_async(streams_redis, JOB, "vision", "started")

        assert await streams_redis.xlen(md5_stream(JOB, 3)) == 1


class TestOnACluster:
    def test_a_cluster_client_writes_the_tagged_shards_the_routers_read_there(
        self, redis_cluster: ClusterGroup
    ) -> None:
        seed = redis_cluster.masters()[0].master.port
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=seed)
        try:
            first = publish_stage_event(client, JOB, "vision", "started", progress=0)
            again = publish_stage_event(client, JOB, "vision", "started", progress=0)
            tagged = producer_config(tagged=True).family.stream_for(JOB)
            assert first == again
            assert "{" in tagged
            assert client.xlen(tagged) == 1
        finally:
            client.close()
