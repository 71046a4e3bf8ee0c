"""A viewer's bounded queue of live events, shared by the feed adapters."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from eco_router.application.port_values import FeedClosed, FeedGap, LiveEvent
from eco_router.domain.sse import GatewayEvent

SLOW_CLIENT = "slow_client"


class ViewerBuffer:
    """At most `maxsize` events: the intermediate ones in arrival order, then one terminal.

    Policy, each step O(1):
    - Full: the oldest intermediate event is dropped to make room (none left: the new
      intermediate event itself is dropped).
    - Only the last terminal (`done`/failed) event is kept, always read last: the stream
      ends with it, so anything queued behind it would never be sent.
    - Any drop sets `gap`: the viewer must catch up from the job's history, which holds
      whatever was dropped.
    """

    __slots__ = ("_events", "_maxsize", "_terminal", "gap")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("a viewer buffer holds at least one event")
        # Made when an event waits and dropped once it is empty again: most viewers are
        # written to straight from the fan-out, and an empty deque costs 760 bytes, on
        # each of thousands of connections.
        self._events: deque[GatewayEvent] | None = None
        self._terminal: GatewayEvent | None = None
        self._maxsize = maxsize
        self.gap = False

    def __len__(self) -> int:
        waiting = len(self._events) if self._events is not None else 0
        return waiting + (self._terminal is not None)

    def put(self, event: GatewayEvent) -> int:
        """Queue `event`; returns how many events were dropped for it (0 or 1)."""
        if event.terminal:
            if self._terminal is not None:
                self._terminal = event
                return self._dropped()
            self._terminal = event
            if len(self) > self._maxsize:
                self._pop_event()
                return self._dropped()
            return 0
        if len(self) < self._maxsize:
            if self._events is None:
                self._events = deque()
            self._events.append(event)
            return 0
        if self._events:
            self._events.popleft()
            self._events.append(event)
        return self._dropped()

    def pop(self) -> GatewayEvent | None:
        if self._events:
            return self._pop_event()
        terminal, self._terminal = self._terminal, None
        return terminal

    def _pop_event(self) -> GatewayEvent:
        events = self._events
        assert events
        event = events.popleft()
        if not events:
            self._events = None
        return event

    def _dropped(self) -> int:
        self.gap = True
        return 1


class ViewerQueue:
    """A `ViewerBuffer` a viewer can wait on. A dropped event makes the viewer's next read a
    `FeedGap` (so it catches up from the history); so does `mark_gap`. Once closed, the
    events still queued are read, then `FeedClosed`."""

    __slots__ = ("_buffer", "_closed", "_gap", "_on_drop", "_waiter", "write_through")

    def __init__(self, *, maxsize: int, on_drop: Callable[[int], None] | None = None) -> None:
        self._buffer = ViewerBuffer(maxsize)
        self._gap: str | None = None
        self._closed = False
        # Only while the viewer waits: a future then, not an `asyncio.Event` for the life
        # of the connection (with its dict and its waiters' deque, about 1 KiB).
        self._waiter: asyncio.Future[None] | None = None
        self._on_drop = on_drop
        self.write_through: Callable[[LiveEvent], bool] | None = None

    def __len__(self) -> int:
        return len(self._buffer)

    def offer(self, live: LiveEvent) -> None:
        """`live` written through while the viewer waits with nothing queued and no gap
        pending (the handler's say), else queued: the one place where a live event takes
        the direct way or the queue."""
        if (
            self._waiter is not None
            and self.write_through is not None
            and self._gap is None
            and not len(self._buffer)
            and self.write_through(live)
        ):
            return
        self.put(live.event)

    def put(self, event: GatewayEvent) -> None:
        dropped = self._buffer.put(event)
        if dropped:
            if self._gap is None:
                self._gap = SLOW_CLIENT
            if self._on_drop is not None:
                self._on_drop(dropped)
        self._wake()

    def mark_gap(self, reason: str) -> None:
        """Events may have been lost upstream (e.g. the Pub/Sub connection dropped)."""
        self._gap = reason
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def get_nowait(self) -> GatewayEvent | None:
        """The next queued event, unless a gap notice comes first (then None)."""
        if self._gap is not None:
            return None
        return self._buffer.pop()

    async def get(self, timeout_s: float) -> GatewayEvent | FeedGap | FeedClosed | None:
        if not len(self._buffer) and self._gap is None and not self._closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await self._waiter
            finally:
                self._waiter = None
        if self._gap is not None:
            reason, self._gap = self._gap, None
            self._buffer.gap = False
            return FeedGap(reason)
        event = self._buffer.pop()
        if event is not None:
            return event
        return FeedClosed() if self._closed else None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
