"""The real clock."""

from __future__ import annotations

import time

from eco_router.application.ports import Clock


class SystemClock(Clock):
    """Wall-clock milliseconds and the monotonic clock of this process."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()
