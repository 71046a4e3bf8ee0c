"""A publisher made without a URL writes where the `eco-router` commands would: to the Redis
of the `serve --embedded-redis` (`make run`) running on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redis.asyncio import Redis

from eco_router.entrypoints.discovery import URL_VARIABLES, ServeRecord, write_record
from eco_router.producer import (
    InMemoryServeOnly,
    connect,
    connect_async,
    producer_config,
    streams_url,
)
from eco_router.testing import RedisServer

pytestmark = pytest.mark.integration

CONFIG = producer_config(domain="scan", shards=4)


@pytest.fixture
def discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty discovery directory of this user, and no URL in the environment."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    for name in URL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return tmp_path / "eco-router"


def announce(directory: Path, streams: str | None) -> None:
    """What a running `serve` writes (this test's own process stands for it: alive)."""
    record = ServeRecord(os.getpid(), "http://127.0.0.1:1", streams, streams)
    write_record(record, directory)


class TestConnectWithoutAUrl:
    async def test_the_blocking_publisher_writes_to_the_running_serves_redis(
        self, discovery: Path, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        announce(discovery, streams_server.url)

        entry_id = connect(config=CONFIG).publish_stage_event("job-found", "queued", "queued")

        stream = CONFIG.family.stream_for("job-found")
        assert [e[0].decode() for e in await streams_redis.xrange(stream)] == [entry_id]

    async def test_the_asyncio_publisher_writes_there_too(
        self, discovery: Path, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        announce(discovery, streams_server.url)
        publisher = connect_async(config=CONFIG)

        entry_id = await publisher.publish_stage_event("job-found", "queued", "queued")

        stream = CONFIG.family.stream_for("job-found")
        assert [e[0].decode() for e in await streams_redis.xrange(stream)] == [entry_id]

    def test_the_environments_url_comes_first(
        self, discovery: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        announce(discovery, "redis://127.0.0.1:2/0")
        monkeypatch.setenv("REDIS_STREAMS_URL", "redis://127.0.0.1:3/0")

        assert streams_url() == "redis://127.0.0.1:3/0"

    def test_with_nothing_running_it_is_the_default_server(self, discovery: Path) -> None:
        assert streams_url() == "redis://localhost:6379/0"

    def test_a_serve_in_memory_only_is_refused_in_one_line(self, discovery: Path) -> None:
        announce(discovery, None)

        with pytest.raises(InMemoryServeOnly, match="in-memory adapters") as refused:
            connect(config=CONFIG)
        assert "\n" not in str(refused.value)
