"""The console's snapshot stream, frame by frame: snapshots, the cause while Redis cannot be
read, and its end when the process shuts down (in-memory adapters)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import FastAPI

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.dead_letter_archive import InMemoryDeadLetterArchive
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.leases import InMemoryLeaseStore
from eco_router.adapters.memory.shard_progress import InMemoryShardProgress
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.console_snapshot import ReadConsoleSnapshot
from eco_router.domain.streams import StreamFamily
from eco_router.entrypoints.http import console_routes
from eco_router.entrypoints.http.public_errors import EpisodeLog

SCAN = StreamFamily("scan:events", 2)


def reader() -> tuple[ReadConsoleSnapshot, InMemoryLeaseStore]:
    streams = InMemoryStreams(ManualClock())
    leases = InMemoryLeaseStore(streams.lease_table("g"), ttl_ms=4000)
    read = ReadConsoleSnapshot(
        leases=leases,
        source=InMemoryEventSource(streams, families=[SCAN], group="g", consumer="c"),
        progress=InMemoryShardProgress(streams, families=[SCAN], group="g"),
        archive=InMemoryDeadLetterArchive(streams),
        families=[SCAN],
        group="g",
    )
    return read, leases


def parse(frame: bytes) -> tuple[str, dict[str, Any]]:
    lines = dict(line.split(": ", 1) for line in frame.decode().strip().split("\n"))
    return lines["event"], orjson.loads(lines["data"])


async def test_the_stream_sends_a_retry_hint_then_snapshots() -> None:
    read, _ = reader()
    frames = console_routes._snapshot_frames(read, 0.01, asyncio.Event(), EpisodeLog())

    assert await anext(frames) == b"retry: 10\n\n"
    event, data = parse(await anext(frames))

    assert event == "snapshot"
    assert [s["stream"] for d in data["domains"] for s in d["shards"]] == list(SCAN.streams)
    await frames.aclose()


async def test_while_the_state_cannot_be_read_the_stream_says_why_and_goes_on() -> None:
    read, leases = reader()
    frames = console_routes._snapshot_frames(read, 0.01, asyncio.Event(), EpisodeLog())
    await anext(frames)
    leases.available = False

    event, data = parse(await anext(frames))
    leases.available = True
    after, _ = parse(await anext(frames))

    assert event == "unavailable"
    # The adapter's own words (addresses, driver text) are for the log only.
    assert data == {"detail": "redis unavailable, retry later"}
    assert after == "snapshot"
    await frames.aclose()


async def test_shutting_down_ends_every_open_stream() -> None:
    app = FastAPI()
    app.state.console_closing = asyncio.Event()
    read, _ = reader()
    # A refresh far longer than any test: only the shutdown can end the wait.
    frames = console_routes._snapshot_frames(read, 3600, app.state.console_closing, EpisodeLog())
    await anext(frames)
    await anext(frames)

    console_routes.end_streams(app)

    assert [frame async for frame in frames] == []
