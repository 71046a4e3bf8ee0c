"""Shared fixtures: private redis-server processes and clients bound to the test's loop."""

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from eco_router.testing import RedisServer

_INTEGRATION_DIR = Path(__file__).parent / "integration"
# Their tests start no server and bind no port (the deployment kit's integration-marked ones
# aside), so pytest-xdist may run them side by side. Everything else stays serial: it starts
# redis-server and router processes on ports found free a moment before, and tests/faults
# measures timing under load.
_PARALLEL_DIRS = (Path(__file__).parent / "unit", Path(__file__).parent / "deploy")


# The documented default URL, redis://localhost:6379/0, may be some other service's server on a
# developer's machine. Any test or process it starts that forgets to name its server gets a
# closed port instead, so it fails loudly rather than writing to a server it did not start.
UNREACHABLE_URL = "redis://127.0.0.1:1/0"


def pytest_configure(config: pytest.Config) -> None:
    del config
    for name in ("REDIS_STREAMS_URL", "REDIS_PUBSUB_URL"):
        os.environ[name] = UNREACHABLE_URL


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration/ as ``integration``, and those that may run in
    parallel as ``parallel`` (`make test` runs ``-m parallel`` on every core, then the rest)."""
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
        elif (
            any(directory in item.path.parents for directory in _PARALLEL_DIRS)
            and item.get_closest_marker("integration") is None
        ):
            item.add_marker(pytest.mark.parallel)


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
