"""An asyncio event loop on a manual clock: time moves only when a test lets it, timer by timer."""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable
from contextvars import Context
from typing import Any

from eco_router.adapters.memory.clock import ManualClock

# Loop iterations one `run_until_idle` may take before the tasks count as spinning.
MAX_ITERATIONS = 200_000


class VirtualClock(ManualClock):
    """A `ManualClock` whose monotonic time is its milliseconds since it started, exactly.

    `ManualClock` adds each step to a float, so after many steps a deadline computed as
    `now + delay` can sit a hair above the time the clock shows once that delay has passed.
    """

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        super().__init__(now_ms)
        self._origin_ms = now_ms

    def monotonic(self) -> float:
        return (self.now_ms() - self._origin_ms) / 1000


class Spinning(AssertionError):
    """The tasks never all waited: something loops without waiting for time or an event."""


class _IdleSelector(selectors.DefaultSelector):
    """Never blocks: when the loop would wait (nothing ready), it asks `idle` instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout > 0:
            self._loop.idle(timeout)
        else:
            self._loop.busy()
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is `clock.monotonic()`, for driving use cases deterministically.

    `run_until_idle(ms)` runs every callback that is ready; when all tasks wait, the clock
    jumps to the next timer, as long as it falls within `ms` of the start. It returns once
    every task waits for an event or for a timer beyond that horizon, with the clock at the
    horizon. No real time is spent waiting, and callbacks run in the loop's own order, so a
    run repeats exactly. The tasks must not wait for real I/O: nothing here polls for it.

    Timers fire on the clock's millisecond grid, at the first millisecond not before their
    time: a timer set a hair after now (a deadline minus the time, rounded) waits for the next
    millisecond instead of firing at once, over and over, while the clock stands still.
    """

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._horizon_ms = clock.now_ms()
        self._iterations = 0
        self._spinning = False
        self._ready_now: set[str] = set()
        super().__init__(_IdleSelector(self))

    def time(self) -> float:
        return self._clock.monotonic()

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        ms = math.ceil(when * 1000)
        if ms / 1000 < when:  # `when * 1000` rounded a hair away
            ms += 1
        return super().call_at(ms / 1000, callback, *args, context=context)

    def run_until_idle(self, ms: int = 0) -> None:
        """Run the tasks, letting `ms` of virtual time pass, until every task waits."""
        self._horizon_ms = self._clock.now_ms() + ms
        self._iterations = 0
        self._spinning = False
        self.run_forever()
        if self._spinning:
            raise Spinning(
                f"tasks still busy after {MAX_ITERATIONS} loop iterations; ready to run:\n"
                + "\n".join(sorted(self._ready_now))
            )

    def cancel_all(self, *, within_ms: int = 60_000) -> None:
        """Cancel every task and run until all have ended (their cleanup may take time)."""
        tasks = asyncio.all_tasks(self)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        self._horizon_ms = self._clock.now_ms() + within_ms
        self._iterations = 0
        self.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def idle(self, timeout: float | None) -> None:
        """Every task waits: move the clock to the next timer, or stop at the horizon."""
        now_ms = self._clock.now_ms()
        if timeout is not None:
            # Both ends are on the millisecond grid: only rounding noise is below a millisecond.
            step_ms = max(1, round(timeout * 1000))
            if now_ms + step_ms <= self._horizon_ms:
                self._clock.advance(step_ms)
                return
        if self._horizon_ms > now_ms:
            self._clock.advance(self._horizon_ms - now_ms)
        self.stop()

    def busy(self) -> None:
        self._iterations += 1
        if self._iterations > MAX_ITERATIONS and not self._spinning:
            self._spinning = True
            due = [h for h in self._scheduled if h.when() <= self.time()]  # type: ignore[attr-defined]
            self._ready_now = {_describe(h) for h in [*self._ready, *due]}  # type: ignore[attr-defined]
            self.stop()


def where(task: asyncio.Task[Any]) -> str:
    """The task's name and the chain of coroutines it is in, innermost last."""
    chain, step = [], task.get_coro()
    while step is not None:
        frame = getattr(step, "cr_frame", None)
        line = frame.f_lineno if frame is not None else "-"
        chain.append(f"{getattr(step, '__qualname__', type(step).__name__)}:{line}")
        step = getattr(step, "cr_await", None)
    return f"{task.get_name()}: {' > '.join(chain)}"


def _describe(handle: asyncio.Handle) -> str:
    """What a ready callback resumes: a task's coroutine chain, or the callback's name."""
    owner = getattr(getattr(handle, "_callback", None), "__self__", None)
    owner = getattr(owner, "_task", owner)  # a timeout's task
    if isinstance(owner, asyncio.Task):
        return f"{handle!r} for {where(owner)}"
    return repr(handle)
