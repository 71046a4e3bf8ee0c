"""Loops that run a job every interval until stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from eco_router.application.errors import TransientError
from eco_router.application.stopping import sleep_unless_stopped

log = logging.getLogger(__name__)


async def run_every(
    interval_s: float,
    stop: asyncio.Event,
    job: Callable[[], Awaitable[object]],
    *,
    name: str,
    run_first: bool = True,
) -> None:
    """Run `job` every `interval_s` until `stop`; a failing run is logged and the loop goes on."""
    if not run_first and await sleep_unless_stopped(stop, interval_s):
        return
    while not stop.is_set():
        try:
            await job()
        except TransientError as error:
            log.warning("%s: transient failure: %s", name, error)
        except Exception:
            log.exception("%s failed", name)
        if await sleep_unless_stopped(stop, interval_s):
            return
