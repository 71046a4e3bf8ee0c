"""Waiting for an eventual condition without asserting on time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout_s: float = 15.0, every_s: float = 0.02
) -> T:
    """The first truthy value `probe` returns; AssertionError if none comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s (last value {value!r})")
        await asyncio.sleep(every_s)
