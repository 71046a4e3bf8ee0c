"""In-memory adapter of `EventFeed` over `InMemoryBroadcaster`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from eco_router.adapters.feed_queue import ViewerQueue
from eco_router.adapters.memory.broadcaster import InMemoryBroadcaster
from eco_router.application.port_values import FeedClosed, FeedGap, LiveEvent
from eco_router.application.ports import (
    EventDecoder,
    EventFeed,
    FeedSubscription,
    GatewayMetrics,
)
from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.sse import GatewayEvent


class InMemoryFeedSubscription(FeedSubscription):
    """Pumps the broadcaster's queue for one channel into a bounded viewer queue."""

    def __init__(
        self,
        broadcaster: InMemoryBroadcaster,
        channel: str,
        domain: str,
        decoder: EventDecoder,
        viewer: ViewerQueue,
        open_viewers: set[ViewerQueue],
    ) -> None:
        self._broadcaster = broadcaster
        self._open_viewers = open_viewers
        self._channel = channel
        self._source = broadcaster.subscribe(channel)
        self._viewer = viewer
        self._domain = domain
        self._decoder = decoder
        self._pump = asyncio.create_task(self._forward())

    async def _forward(self) -> None:
        while True:
            payload = await self._source.get()
            event = self._decoder.decode(payload)
            if event is not None and event.belongs_to(self._domain):
                live = LiveEvent(event)
                self._viewer.offer(live)
                live.settle()

    async def next(self, timeout_s: float) -> GatewayEvent | FeedGap | FeedClosed | None:
        return await self._viewer.get(timeout_s)

    def next_nowait(self) -> GatewayEvent | None:
        return self._viewer.get_nowait()

    def write_through(self, handler: Callable[[LiveEvent], bool] | None) -> None:
        self._viewer.write_through = handler

    async def close(self) -> None:
        self._open_viewers.discard(self._viewer)
        self._broadcaster.unsubscribe(self._channel, self._source)
        await cancel_and_wait([self._pump])
        # The pump ends only when cancelled, or by a bug: that is raised, not dropped.
        if not self._pump.cancelled() and (error := self._pump.exception()) is not None:
            raise error


class InMemoryEventFeed(EventFeed):
    """Live events straight from an `InMemoryBroadcaster` in the same process."""

    def __init__(
        self,
        broadcaster: InMemoryBroadcaster,
        *,
        decoder: EventDecoder,
        metrics: GatewayMetrics,
        queue_size: int = 256,
    ) -> None:
        self._broadcaster = broadcaster
        self._decoder = decoder
        self._metrics = metrics
        self._queue_size = queue_size
        self._open_viewers: set[ViewerQueue] = set()
        self._closed = False

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        viewer = ViewerQueue(maxsize=self._queue_size, on_drop=self._metrics.events_dropped)
        if self._closed:
            viewer.close()
        self._open_viewers.add(viewer)
        return InMemoryFeedSubscription(
            self._broadcaster,
            self._broadcaster.channel(job_id),
            domain,
            self._decoder,
            viewer,
            self._open_viewers,
        )

    def close_viewers(self) -> None:
        self._closed = True
        for viewer in self._open_viewers:
            viewer.close()
