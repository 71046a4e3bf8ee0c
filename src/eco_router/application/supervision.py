"""Supervising a long-running task: restarted with back-off when it dies, never lost."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from eco_router.application.backoff import Backoff
from eco_router.application.stopping import sleep_unless_stopped

log = logging.getLogger(__name__)


class TaskKeptFailing(Exception):
    """A supervised task died too often in too short a time: the process should end."""

    def __init__(self, task: str, deaths: int, window_s: float) -> None:
        super().__init__(f"the {task} task died {deaths} times within {window_s:.0f} s")
        self.task = task


class TaskRecord(Protocol):
    """Where a supervisor records its task's life, for readiness and metrics."""

    def task_running(self, task: str) -> None: ...

    def task_failed(self, task: str, state: str) -> None: ...

    def task_restarted(self, task: str) -> None: ...


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    until: asyncio.Event,
    *,
    health: TaskRecord,
    backoff: Backoff,
    max_restarts: int | None,
    restart_window_s: float,
) -> None:
    """Run `run()` to its end, starting it again with back-off when it dies with an unexpected
    error (logged with its traceback, recorded in `health`), until `until` is set.
    `TaskKeptFailing` when it dies more than `max_restarts` times within `restart_window_s`
    (None: it is always started again)."""
    deaths: deque[float] = deque()
    while True:
        health.task_running(name)
        try:
            await run()
            return
        except Exception as error:
            now = time.monotonic()
            while deaths and now - deaths[0] > restart_window_s:
                deaths.popleft()
            if not deaths:
                backoff.reset()
            deaths.append(now)
            if max_restarts is not None and len(deaths) > max_restarts:
                health.task_failed(name, f"kept failing: {type(error).__name__}: {error}")
                log.critical(
                    "%s died %d times within %.0f s, giving up: %s: %s",
                    name,
                    len(deaths),
                    restart_window_s,
                    type(error).__name__,
                    error,
                )
                raise TaskKeptFailing(name, len(deaths), restart_window_s) from error
            log.error("%s died, restarting it", name, exc_info=error)
            health.task_failed(name, f"restarting after {type(error).__name__}: {error}")
        if await sleep_unless_stopped(until, backoff.next_delay()):
            return
        health.task_restarted(name)
