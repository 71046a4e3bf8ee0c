"""Fixtures shared by the integration tests: worker processes and a Pub/Sub collector."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from eco_router.testing import RedisServer
from tests.integration.support import PubSubCollector, WorkerProcess, Workers

# Redis Sentinel groups and Redis Clusters, shared by a module's tests.
from tests.integration.topology_fixtures import (
    redis_cluster,
    sentinel_group,
    shared_cluster,
    shared_sentinel,
)

__all__ = ["redis_cluster", "sentinel_group", "shared_cluster", "shared_sentinel"]


@pytest.fixture
def workers(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> Iterator[Workers]:
    """Starts `eco-router worker` processes on the test's servers; kills them afterwards."""
    launcher = Workers(tmp_path, streams_url=streams_server.url, pubsub_url=pubsub_server.url)
    yield launcher
    launcher.kill_all()


@pytest.fixture
async def subscriber(pubsub_server: RedisServer) -> AsyncIterator[PubSubCollector]:
    """Everything published on `sse:events:*` during the test."""
    async with PubSubCollector(pubsub_server.url) as collector:
        yield collector


@pytest.fixture
async def worker(workers: Workers) -> WorkerProcess:
    """One running worker with default test settings."""
    return await workers.start()
