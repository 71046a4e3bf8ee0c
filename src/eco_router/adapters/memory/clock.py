"""A clock that tests move by hand."""

from __future__ import annotations

from eco_router.application.ports import Clock


class ManualClock(Clock):
    """Stands still until `advance()`; starts at a realistic epoch time."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms
        self._monotonic = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, ms: int) -> None:
        self._now_ms += ms
        self._monotonic += ms / 1000
