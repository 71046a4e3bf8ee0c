"""Keepalives for many connections at once, without a timer or a task wake-up per connection."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Protocol

log = logging.getLogger(__name__)


class KeptAlive(Protocol):
    def keep_alive_at(self, now: float) -> None:
        """Looked at once due: write the keepalive if idle for the whole period, and file
        itself again for its next due time."""
        ...


class Keepalives:
    """The connections that keep themselves alive, filed by when their next keepalive is due
    (to the tick: `TICK_S`, or a quarter of the shortest period if less). Each tick looks at
    the connections due by then only: one that got nothing for its period is written the
    keepalive frame, one written to since is filed again for a period after that write.

    A timer per connection would wake its stream's task for each keepalive: on 10,000 idle
    streams with a 15 s keepalive, that was most of the gateway's CPU between events. Here
    each connection costs one check per period (and a write only if it was idle), spread
    over the ticks instead of a sweep of all of them that would hold up the loop.
    """

    TICK_S = 1.0

    __slots__ = ("_due", "_failing", "_tick_s", "_timer")

    def __init__(self) -> None:
        self._due: dict[int, set[KeptAlive]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tick_s = self.TICK_S
        self._failing = False

    def __len__(self) -> int:
        return sum(map(len, self._due.values()))

    def file(self, writer: KeptAlive, due: float, every_s: float) -> int:
        """File `writer` to be looked at once loop time `due` has come; returns its tick."""
        self._tick_s = min(self._tick_s, every_s / 4)
        # The tick under way when it is due: looked at by the first sweep from then on, so
        # at most about a tick late (one looked at a little early is filed again).
        tick = math.floor(due / self._tick_s)
        self._due.setdefault(tick, set()).add(writer)
        if self._timer is None:
            self._schedule()
        return tick

    def discard(self, writer: KeptAlive, tick: int) -> None:
        writers = self._due.get(tick)
        if writers is not None:
            writers.discard(writer)
            if not writers:
                del self._due[tick]
        if not self._due and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sweep(self, now: float) -> None:
        """Look at every connection due by `now` (loop time)."""
        current = math.floor(now / self._tick_s)
        for tick in sorted(tick for tick in self._due if tick <= current):
            for writer in self._due.pop(tick):
                writer.keep_alive_at(now)

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._tick_s, self._run)

    def _run(self) -> None:
        self._timer = None
        try:
            self.sweep(asyncio.get_running_loop().time())
        except Exception:
            # Logged once per episode; the next tick tries again.
            if not self._failing:
                log.exception("writing keepalives failed")
            self._failing = True
        else:
            self._failing = False
        finally:
            if self._due and self._timer is None:
                self._schedule()
