"""The streams-side port contracts on Redis Sentinel and on a 3-master Redis Cluster, exactly
as on one server: the same tests, on a Sentinel group's master (plain names) and on the
cluster (hash-tagged names, one slot per shard, spread over the masters)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from eco_router.adapters.redis.connections.connection import RedisClient, async_redis_client
from eco_router.testing import ClusterGroup, SentinelGroup
from tests.contracts.factories import FAMILIES, TAGGED_FAMILIES

# The modules, not their classes: a test class imported by name would be collected here again.
from tests.integration import test_console_contracts_redis as console
from tests.integration import test_contracts_redis as ports
from tests.integration.topology_fixtures import Shared


class _Cut:
    """Stops a whole group (every data node) for the tests that cut the server."""

    def __init__(
        self,
        group: SentinelGroup | ClusterGroup,
        shared: Shared[SentinelGroup] | Shared[ClusterGroup],
    ) -> None:
        self._group = group
        self._shared = shared

    def stop(self) -> None:
        self._shared.broken = True
        servers = (
            self._group.nodes if isinstance(self._group, ClusterGroup) else self._group.servers
        )
        for server in servers:
            server.stop()


@pytest.fixture
async def cluster_redis(redis_cluster: ClusterGroup) -> AsyncIterator[RedisClient]:
    client = async_redis_client(redis_cluster.url)
    yield client
    await client.aclose()


@pytest.fixture
async def sentinel_redis(sentinel_group: SentinelGroup) -> AsyncIterator[RedisClient]:
    client = async_redis_client(sentinel_group.url)
    yield client
    await client.aclose()


class OnCluster:
    families = TAGGED_FAMILIES

    @pytest.fixture(autouse=True)
    def _backend(
        self,
        redis_cluster: ClusterGroup,
        shared_cluster: Shared[ClusterGroup],
        cluster_redis: RedisClient,
    ) -> None:
        self.redis = cluster_redis  # type: ignore[assignment]
        self.server = _Cut(redis_cluster, shared_cluster)  # type: ignore[assignment]
        self.url = redis_cluster.url


class OnSentinel:
    families = FAMILIES

    @pytest.fixture(autouse=True)
    def _backend(
        self,
        sentinel_group: SentinelGroup,
        shared_sentinel: Shared[SentinelGroup],
        sentinel_redis: RedisClient,
    ) -> None:
        self.redis = sentinel_redis  # type: ignore[assignment]
        self.server = _Cut(sentinel_group, shared_sentinel)  # type: ignore[assignment]
        self.url = sentinel_group.url


class TestEventSourceOnCluster(OnCluster, ports.TestRedisStreamEventSource):
    pass


class TestStateStoreOnCluster(OnCluster, ports.TestRedisLuaStateStore):
    pass


class TestDeadLetterSinkOnCluster(OnCluster, ports.TestRedisStreamDeadLetterSink):
    pass


class TestLeaseStoreOnCluster(OnCluster, ports.TestRedisLeaseStore):
    pass


class TestDeadLetterArchiveOnCluster(OnCluster, console.TestRedisDeadLetterArchive):
    pass


class TestShardProgressOnCluster(OnCluster, console.TestRedisShardProgress):
    pass


class TestControlStoreOnCluster(OnCluster, ports.TestRedisControlStore):
    pass


class TestControlStoreThroughSentinel(OnSentinel, ports.TestRedisControlStore):
    pass


class TestEventSourceThroughSentinel(OnSentinel, ports.TestRedisStreamEventSource):
    pass


class TestStateStoreThroughSentinel(OnSentinel, ports.TestRedisLuaStateStore):
    pass


class TestDeadLetterSinkThroughSentinel(OnSentinel, ports.TestRedisStreamDeadLetterSink):
    pass


class TestLeaseStoreThroughSentinel(OnSentinel, ports.TestRedisLeaseStore):
    pass


class TestDeadLetterArchiveThroughSentinel(OnSentinel, console.TestRedisDeadLetterArchive):
    pass


class TestShardProgressThroughSentinel(OnSentinel, console.TestRedisShardProgress):
    pass
