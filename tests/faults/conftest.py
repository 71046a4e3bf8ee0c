"""Fixtures of the fault scenarios: a rig per scenario, torn down whatever the outcome."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eco_router.testing import RedisServer
from tests.faults.harness import FaultRig

OpenRig = Callable[..., FaultRig]


@pytest.fixture
async def open_rig(tmp_path: Path) -> AsyncIterator[OpenRig]:
    """Builds the scenario's rig; its processes, viewers and load are stopped afterwards."""
    rigs: list[FaultRig] = []

    def build(**options: Any) -> FaultRig:
        rig = FaultRig(tmp_path, **options)
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
