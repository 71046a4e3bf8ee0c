"""Redis Sentinel groups and Redis Clusters for the topology tests, shared across a module.

A shared group is handed to each test healthy and empty: it is flushed before the test, and
started again when a test left it broken (a cut server, a failover).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

import pytest

from eco_router.testing import ClusterGroup, RedisServer, SentinelGroup, resp

G = TypeVar("G", ClusterGroup, SentinelGroup)


class Shared(Generic[G]):
    """One group per module, replaced when a test broke it."""

    def __init__(self, make: type[G]) -> None:
        self._make = make
        self._group: G | None = None
        self.broken = False

    def get(self) -> G:
        if self._group is not None and (self.broken or not _healthy(self._group)):
            self._group.stop()
            self._group = None
        if self._group is None:
            self._group = self._make()
            self._group.start()
        self.broken = False
        for server in _data_nodes(self._group):
            if _is_master(server):
                resp.call(server.port, "FLUSHALL", "SYNC", timeout=5.0)
        return self._group

    def stop(self) -> None:
        if self._group is not None:
            self._group.stop()


def _data_nodes(group: ClusterGroup | SentinelGroup) -> tuple[RedisServer, ...]:
    return group.nodes if isinstance(group, ClusterGroup) else group.servers


def _healthy(group: ClusterGroup | SentinelGroup) -> bool:
    servers = _data_nodes(group)
    if isinstance(group, SentinelGroup):
        servers += group.sentinels
    return all(server.running for server in servers)


def _is_master(server: RedisServer) -> bool:
    return "role:master" in resp.text(resp.call(server.port, "INFO", "replication"))


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[Shared[ClusterGroup]]:
    shared = Shared(ClusterGroup)
    yield shared
    shared.stop()


@pytest.fixture(scope="module")
def shared_sentinel() -> Iterator[Shared[SentinelGroup]]:
    shared = Shared(SentinelGroup)
    yield shared
    shared.stop()


@pytest.fixture
def redis_cluster(shared_cluster: Shared[ClusterGroup]) -> ClusterGroup:
    """A healthy, empty 3-master / 3-replica cluster (shared by the module)."""
    return shared_cluster.get()


@pytest.fixture
def sentinel_group(shared_sentinel: Shared[SentinelGroup]) -> SentinelGroup:
    """A healthy, empty master with 2 replicas and 3 sentinels (shared by the module)."""
    return shared_sentinel.get()
