"""Shared fixtures: private redis-server processes and clients bound to the test's loop."""

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from eco_router.testing import RedisServer

_INTEGRATION_DIR = Path(__file__).parent / "integration"


# The documented default URL, redis://localhost:6379/0, may be some other service's server on a
# developer's machine. Any test or process it starts that forgets to name its server gets a
# closed port instead, so it fails loudly rather than writing to a server it did not start.
UNREACHABLE_URL = "redis://127.0.0.1:1/0"


def pytest_configure(config: pytest.Config) -> None:
    del config
    for name in ("REDIS_STREAMS_URL", "REDIS_PUBSUB_URL"):
        os.environ[name] = UNREACHABLE_URL


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration/ as ``integration``."""
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def streams_server() -> Iterator[RedisServer]:
    """A fresh redis-server for Redis Streams, deleted after the test."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def pubsub_server() -> Iterator[RedisServer]:
    """A fresh redis-server for Pub/Sub, separate from the streams one as in production."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def streams_redis(streams_server: RedisServer) -> AsyncIterator[Redis]:
    """A client for ``streams_server``, created in the test's event loop."""
    client = Redis.from_url(streams_server.url)
    yield client
    await client.aclose()


@pytest.fixture
async def pubsub_redis(pubsub_server: RedisServer) -> AsyncIterator[Redis]:
    """A client for ``pubsub_server``, created in the test's event loop."""
    client = Redis.from_url(pubsub_server.url)
    yield client
    await client.aclose()
