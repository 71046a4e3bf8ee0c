"""The HTTP app with its lifespan, on real Redis servers and on in-memory adapters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from redis.asyncio import Redis

from eco_router.adapters.memory.broadcaster import InMemoryBroadcaster
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.entrypoints.container import build_container, use_in_memory
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.settings import Settings, load_settings
from eco_router.testing import RedisServer
from tests.environment import clear_settings
from tests.integration.support import (
    FAMILIES_SPEC,
    SCAN,
    add_event,
    eventually,
    job_state,
    metric_value,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


def settings_for(streams_url: str, pubsub_url: str) -> Settings:
    return load_settings(
        REDIS_STREAMS_URL=streams_url,
        REDIS_PUBSUB_URL=pubsub_url,
        streams=FAMILIES_SPEC,
        consumer_name="http-app",
        read_block_ms=200,
        gateway_metrics=True,
    )


@pytest.fixture
def real_app(streams_server: RedisServer, pubsub_server: RedisServer) -> Iterator[FastAPI]:
    container = build_container(settings_for(streams_server.url, pubsub_server.url))
    yield create_app(container)
    container.unwire()


def client_of(manager: LifespanManager) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://router.test"
    )


class ConnectionCounter:
    """A TCP listener that only counts who connects, to prove nobody does."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ConnectionCounter:
        self._server = await asyncio.start_server(self._count, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def _count(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()


@pytest.fixture
async def counter() -> AsyncIterator[ConnectionCounter]:
    async with ConnectionCounter() as listener:
        yield listener


class TestHttpAppOnRedis:
    async def test_health_ready_and_metrics_answer_with_the_router_running(
        self, real_app: FastAPI, streams_redis: Redis
    ) -> None:
        async with LifespanManager(real_app) as manager, client_of(manager) as client:

            async def ready() -> httpx.Response | None:
                response = await client.get("/ready")
                return response if response.status_code == 200 else None

            readiness = await eventually(ready, what="/ready answers 200")
            health = await client.get("/health")
            await add_event(streams_redis, "scan-http", 1, stage="queued")

            async def routed_count() -> float:
                response = await client.get("/metrics")
                return metric_value(
                    response.text, "event_router_events_total", domain="scan", verdict="new"
                )

            routed = await eventually(routed_count, what="the event counted in /metrics")

        assert health.status_code == 200
        assert health.json() == {"status": "ok"}
        assert readiness.json()["checks"] == {
            "streams": "ok",
            "pubsub": "ok",
            "consumer": "ok",
            "leases": "ok",
            "reclaimer": "ok",
            "observer": "ok",
            "feed": "ok",
            "presence": "ok",
        }
        assert routed == 1
        state = await job_state(streams_redis, "scan-http")
        assert state is not None
        assert state["stage"] == "queued"

    async def test_ready_is_503_once_the_streams_server_is_gone_and_names_no_address(
        self, real_app: FastAPI, streams_server: RedisServer
    ) -> None:
        async with LifespanManager(real_app) as manager, client_of(manager) as client:
            await eventually(
                lambda: _status_is(client, "/ready", 200), what="/ready answers 200 first"
            )

            streams_server.stop()

            await eventually(lambda: _status_is(client, "/ready", 503), what="/ready 503")
            response = await client.get("/ready")

        checks = response.json()["checks"]
        assert checks["streams"] == "streams redis unreachable"
        assert checks["pubsub"] == "ok"
        # The public port says which component fails, never where it lives or what the
        # driver said (the worker's port and the log have that).
        assert str(streams_server.port) not in response.text
        assert "127.0.0.1" not in response.text
        assert "Error" not in response.text


class TestHttpAppInMemory:
    async def test_in_memory_adapters_open_no_socket_and_route(
        self, counter: ConnectionCounter
    ) -> None:
        container = build_container(settings_for(counter.url, counter.url))
        use_in_memory(container)
        app = create_app(container)
        try:
            async with LifespanManager(app) as manager, client_of(manager) as client:
                await eventually(
                    lambda: _status_is(client, "/ready", 200), what="/ready answers 200"
                )
                streams: InMemoryStreams = container.memory_streams()
                broadcaster: InMemoryBroadcaster = container.broadcaster()
                streams.xadd(SCAN.stream_for("scan-mem"), {"job_id": "scan-mem", "seq": "1"})
                await eventually(lambda: broadcaster.sent, what="the event broadcast in memory")
                metrics = await client.get("/metrics")
                health = await client.get("/health")
        finally:
            container.unwire()

        assert [channel for channel, _ in broadcaster.sent] == ["sse:events:scan-mem"]
        assert health.status_code == 200
        assert metrics.status_code == 200
        assert counter.connections == 0


async def _status_is(client: httpx.AsyncClient, path: str, status: int) -> bool:
    return (await client.get(path)).status_code == status
