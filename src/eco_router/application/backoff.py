"""Bounded exponential back-off with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Delays that double from `initial_s` up to `max_s`; `reset()` after a success."""

    initial_s: float = 0.05
    max_s: float = 5.0
    jitter: float = 0.2
    _attempt: int = field(default=0, init=False)

    def next_delay(self) -> float:
        base = min(self.max_s, self.initial_s * (2**self._attempt))
        self._attempt = min(self._attempt + 1, 32)
        return float(base * (1 + random.uniform(-self.jitter, self.jitter)))

    def reset(self) -> None:
        self._attempt = 0

    @property
    def failing(self) -> bool:
        return self._attempt > 0
