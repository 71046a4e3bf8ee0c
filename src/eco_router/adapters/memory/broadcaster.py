"""In-memory adapter of `Broadcaster`: a record of what was sent and live subscriber queues."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

from eco_router.application.errors import BroadcastFailed, TransientError
from eco_router.application.port_values import EncodedEvent
from eco_router.application.ports import Broadcaster


class InMemoryBroadcaster(Broadcaster):
    """Keeps every (channel, payload) in `sent`; set `available = False` to make broadcasts fail."""

    def __init__(self, *, channel_prefix: str) -> None:
        self.available = True
        self.sent: list[tuple[str, bytes]] = []
        self._prefix = channel_prefix
        self._subscribers: defaultdict[str, set[asyncio.Queue[bytes]]] = defaultdict(set)

    def channel(self, job_id: str) -> str:
        return f"{self._prefix}:{job_id}"

    async def broadcast(self, events: Sequence[EncodedEvent]) -> None:
        if not self.available:
            raise BroadcastFailed("in-memory Pub/Sub server marked unavailable")
        for item in events:
            channel = self.channel(item.event.job_id)
            self.sent.append((channel, item.payload))
            for queue in self._subscribers.get(channel, ()):
                queue.put_nowait(item.payload)

    async def ping(self) -> None:
        if not self.available:
            raise TransientError("in-memory Pub/Sub server marked unavailable")

    def subscribe(self, channel: str) -> asyncio.Queue[bytes]:
        """A queue that receives every payload published on `channel` from now on."""
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._subscribers[channel].add(queue)
        return queue

    def unsubscribe(self, channel: str, queue: asyncio.Queue[bytes]) -> None:
        self._subscribers[channel].discard(queue)
