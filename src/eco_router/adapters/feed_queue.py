"""A viewer's bounded queue of live events, shared by the feed adapters."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from eco_router.application.messages import FeedClosed, FeedGap
from eco_router.domain.sse import GatewayEvent


class ViewerQueue:
    """Bounded: when full, intermediate events are dropped (never terminal ones) and the
    viewer's next read is a `FeedGap`, so it catches up from the history instead. Once
    closed, the events still queued are read, then `FeedClosed`."""

    def __init__(self, *, maxsize: int, on_drop: Callable[[int], None] | None = None) -> None:
        self._items: deque[GatewayEvent] = deque()
        self._maxsize = maxsize
        self._gap: str | None = None
        self._closed = False
        self._ready = asyncio.Event()
        self._on_drop = on_drop

    def put(self, event: GatewayEvent) -> None:
        accept = True
        if len(self._items) >= self._maxsize:
            kept = deque(e for e in self._items if e.terminal)
            dropped = len(self._items) - len(kept)
            self._items = kept
            self._gap = "slow_client"
            if not event.terminal and len(kept) >= self._maxsize:
                accept = False
                dropped += 1
            if self._on_drop is not None and dropped:
                self._on_drop(dropped)
        if accept:
            self._items.append(event)
        self._ready.set()

    def mark_gap(self, reason: str) -> None:
        """Events may have been lost upstream (e.g. the Pub/Sub connection dropped)."""
        self._gap = reason
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def get(self, timeout_s: float) -> GatewayEvent | FeedGap | FeedClosed | None:
        if not self._items and self._gap is None and not self._closed:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._ready.wait()
        if self._gap is not None:
            reason, self._gap = self._gap, None
            return FeedGap(reason)
        if self._items:
            return self._items.popleft()
        return FeedClosed() if self._closed else None
