"""Waiting that a stop request cuts short."""

from __future__ import annotations

import asyncio
import contextlib


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True when woken by `stop`."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()
