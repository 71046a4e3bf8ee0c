"""Loops that run a job every interval until stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from eco_router.application.backoff import Backoff
from eco_router.application.errors import TransientError
from eco_router.application.router_health import RouterHealth
from eco_router.application.stopping import cancel_and_wait, sleep_unless_stopped


async def run_every(
    interval_s: float,
    stop: asyncio.Event,
    job: Callable[[], Awaitable[object]],
    *,
    name: str,
    health: RouterHealth,
    run_first: bool = True,
    backoff: Backoff | None = None,
    soon: asyncio.Event | None = None,
    soon_after_s: float = 0.0,
) -> None:
    """Run `job` every `interval_s` until `stop`.

    A transient failure is reported to `health` (one warning per episode) and the job is
    tried again after a back-off (never longer than `interval_s`) until it succeeds, as the
    other loops retry: a failure shows in readiness only until the server answers again, not
    until the next interval. Any other error ends the loop, for its supervisor to log and
    restart it.

    With `soon`, a run that succeeded is followed by the next one as soon as `soon` is set,
    but never sooner than `soon_after_s` after it: what `soon` signals within that time goes
    in one run.
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
            if soon is not None:
                if await _sleep_until_soon(stop, interval_s, soon, soon_after_s):
                    return
                continue
            delay_s = interval_s
        if await sleep_unless_stopped(stop, delay_s):
            return


async def _sleep_until_soon(
    stop: asyncio.Event, interval_s: float, soon: asyncio.Event, soon_after_s: float
) -> bool:
    """Sleep `interval_s`, or less once `soon` is set (never less than `soon_after_s`); True
    when woken by `stop`."""
    if await sleep_unless_stopped(stop, min(soon_after_s, interval_s)):
        return True
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(soon.wait())]
    try:
        await asyncio.wait(
            waits, timeout=max(0.0, interval_s - soon_after_s), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        await cancel_and_wait(waits)
    return stop.is_set()
