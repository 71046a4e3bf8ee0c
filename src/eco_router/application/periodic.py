"""Loops that run a job every interval until stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from eco_router.application.backoff import Backoff
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
    backoff: Backoff | None = None,
) -> None:
    """Run `job` every `interval_s` until `stop`.

    A transient failure is reported to `health` (one warning per episode) and the job is
    tried again after a back-off (never longer than `interval_s`) until it succeeds, as the
    other loops retry: a failure shows in readiness only until the server answers again, not
    until the next interval. Any other error ends the loop, for its supervisor to log and
    restart it.
    """
    backoff = backoff or Backoff()
    if not run_first and await sleep_unless_stopped(stop, interval_s):
        return
    while not stop.is_set():
        try:
            await job()
        except TransientError as error:
            health.troubled(name, error)
            delay_s = min(backoff.next_delay(), interval_s)
        else:
            health.untroubled(name)
            backoff.reset()
            delay_s = interval_s
        if await sleep_unless_stopped(stop, delay_s):
            return
