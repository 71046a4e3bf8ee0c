"""Fixtures of the fault scenarios: a rig per scenario, torn down whatever the outcome."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from eco_router.testing import RedisServer, resp
from tests.faults.harness import FaultRig, Scenario

# Redis Sentinel groups and Redis Clusters, one per module, replaced once a test broke one.
from tests.integration.topology_fixtures import (
    redis_cluster,
    sentinel_group,
    shared_cluster,
    shared_sentinel,
)

__all__ = ["redis_cluster", "sentinel_group", "shared_cluster", "shared_sentinel"]

OpenRig = Callable[..., FaultRig]


@pytest.fixture
async def open_rig(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> AsyncIterator[OpenRig]:
    """Builds a scenario's rig on the test's servers; what it started is stopped afterwards.

    `streams` stands in for the streams server; `router_streams_url` and `router_pubsub_url` are
    what the routers dial instead of the servers (a relay).
    """
    rigs: list[FaultRig] = []

    def build(
        scenario: Scenario, *, streams: RedisServer | None = None, **router_urls: str
    ) -> FaultRig:
        streams_url = (streams or streams_server).url
        rig = FaultRig(
            tmp_path, scenario, streams_url=streams_url, pubsub_url=pubsub_server.url, **router_urls
        )
        rigs.append(rig)
        return rig

    yield build
    for rig in rigs:
        await rig.aclose()


@pytest.fixture
def durable_streams_server() -> Iterator[RedisServer]:
    """A streams server with an append-only file, so a restart keeps streams, groups and state."""
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
def replicated_server() -> Iterator[RedisServer]:
    """A server with one replica in sync (and no failover): WAIT 1 is answered."""
    with RedisServer() as master:
        follow = f"replicaof 127.0.0.1 {master.port}\nrepl-diskless-sync-delay 0\n"
        with RedisServer(config=follow) as replica:
            deadline = time.monotonic() + 15
            while "master_link_status:up" not in _replication(replica):
                assert time.monotonic() < deadline, "the replica never caught up"
                time.sleep(0.05)
            yield master


def _replication(server: RedisServer) -> str:
    return resp.text(resp.call(server.port, "INFO", "replication"))
