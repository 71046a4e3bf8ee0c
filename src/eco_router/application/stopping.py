"""Waiting that a stop request cuts short, and cancelling that is sure to end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

# How long a cancelled task may take to end before it is cancelled again.
RECANCEL_AFTER_S = 0.05


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True when woken by `stop`."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until every one has ended, whatever it ends with (which is
    taken, so none is reported as never retrieved).

    A task still running a moment after its cancel is cancelled again: on Python 3.11,
    `asyncio.wait_for` drops a cancel that arrives as the awaited call completes (CPython
    gh-86296), and redis-py wraps every command's send in one when a socket timeout is
    set; such a task would go on into its read and block for as long as the command does.
    """
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    try:
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=RECANCEL_AFTER_S)
    except asyncio.CancelledError:
        for task in pending:
            task.cancel()
        raise
    for task in tasks:
        if not task.cancelled():
            task.exception()
