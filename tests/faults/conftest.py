"""Fixtures of the fault scenarios: a rig per scenario, torn down whatever the outcome."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from eco_router.testing import RedisServer
from tests.faults.harness import FaultRig, Scenario

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
