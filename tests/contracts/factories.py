"""Test data and waiting helpers shared by the port contracts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.application.messages import EncodedEvent
from eco_router.domain.event import JobEvent
from eco_router.domain.streams import StreamFamily

SCAN = StreamFamily("scan:events", 2)
CHAT = StreamFamily("chat:events", 1)
FAMILIES = (SCAN, CHAT)
GROUP = "router"

_ENCODER = OrjsonEventEncoder()


def entry_id(n: int) -> str:
    """A realistic stream entry id, distinct for every `n`."""
    return f"1700000000000-{n}"


def make_event(**overrides: Any) -> JobEvent:
    """A valid progress event of job `job-1` in the scan domain; override any field."""
    fields: dict[str, Any] = {
        "domain": "scan",
        "stream": "scan:events:0",
        "stream_id": entry_id(1),
        "job_id": "job-1",
        "seq": 1,
        "stage": "scanning",
        "status": "running",
    }
    fields.update(overrides)
    return JobEvent(**fields)


def encoded(**overrides: Any) -> EncodedEvent:
    """`make_event(**overrides)` with its real JSON payload."""
    event = make_event(**overrides)
    return EncodedEvent(event, _ENCODER.encode(event))


async def wait_until(
    condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0, what: str = "condition"
) -> None:
    """Poll `condition` until it holds; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
