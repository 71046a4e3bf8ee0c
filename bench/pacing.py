"""The schedule a paced producer keeps: `rate` events/s for `seconds`, a batch every tick."""

from __future__ import annotations

import time

TICK_S = 0.005


class Pacer:
    """Which events are due, by the schedule start + n / rate.

    Pacing catches up on the schedule, so a slow tick does not lower the rate.
    """

    def __init__(self, rate: int, seconds: float, *, max_batch: int | None = None) -> None:
        self.total = int(rate * seconds)
        self.sent = 0
        self._rate = rate
        self._max_batch = max_batch
        self._started = time.monotonic()
        self._next_tick = self._started

    @property
    def finished(self) -> bool:
        return self.sent >= self.total

    def due(self) -> range:
        """The numbers of the events due now (at most `max_batch`), counted as sent."""
        due = min(self.total, int((time.monotonic() - self._started) * self._rate) + 1)
        if self._max_batch is not None:
            due = min(due, self.sent + self._max_batch)
        batch = range(self.sent, max(self.sent, due))
        self.sent = batch.stop
        return batch

    def pause_s(self) -> float:
        """How long to sleep until the next tick."""
        self._next_tick += TICK_S
        return max(0.0, self._next_tick - time.monotonic())

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started
