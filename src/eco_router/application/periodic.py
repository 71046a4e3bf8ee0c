"""Loops that run a job every interval until stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from eco_router.application.errors import TransientError
from eco_router.application.router_health import RouterHealth
from eco_router.application.stopping import sleep_unless_stopped


async def run_every(
    interval_s: float,
    stop: asyncio.Event,
    job: Callable[[], Awaitable[object]],
    *,
    name: str,
    health: RouterHealth,
    run_first: bool = True,
) -> None:
    """Run `job` every `interval_s` until `stop`.

    A transient failure is reported to `health` (one warning per episode) and the loop goes
    on; any other error ends the loop, for its supervisor to log and restart it.
    """
    if not run_first and await sleep_unless_stopped(stop, interval_s):
        return
    while not stop.is_set():
        try:
            await job()
        except TransientError as error:
            health.troubled(name, error)
        else:
            health.untroubled(name)
        if await sleep_unless_stopped(stop, interval_s):
            return
