"""Cancelling tasks until they have ended, even one that drops its first cancel."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from eco_router.application.stopping import cancel_and_wait


async def drops_first_cancel(started: asyncio.Event) -> str:
    """What Python 3.11's `asyncio.wait_for` does when a cancel lands as its call completes:
    the cancel is lost and the task goes on to its next wait."""
    started.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    await asyncio.sleep(3600)
    return "never"


async def test_a_task_that_dropped_its_cancel_is_cancelled_again() -> None:
    started = asyncio.Event()
    task = asyncio.ensure_future(drops_first_cancel(started))
    await started.wait()

    async with asyncio.timeout(10):
        await cancel_and_wait([task])

    assert task.cancelled()


async def test_tasks_that_ended_already_keep_their_ends_and_none_is_raised() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    failed = asyncio.ensure_future(fails())
    finished = asyncio.ensure_future(asyncio.sleep(0, "done"))
    await asyncio.wait([failed, finished])

    await cancel_and_wait([failed, finished])

    assert isinstance(failed.exception(), ValueError)
    assert finished.result() == "done"


async def test_cancelling_the_waiter_cancels_what_is_still_running() -> None:
    started = asyncio.Event()
    stubborn = asyncio.ensure_future(drops_first_cancel(started))
    await started.wait()
    waiter = asyncio.ensure_future(cancel_and_wait([stubborn]))
    await asyncio.sleep(0)  # the first cancel is delivered and dropped

    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter

    with pytest.raises(asyncio.CancelledError):
        await stubborn
