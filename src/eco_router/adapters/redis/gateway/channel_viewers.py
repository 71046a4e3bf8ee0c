"""The viewers of each subscribed Pub/Sub channel: confirmations, fan-out and gap notices."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable

from eco_router.adapters.feed_queue import ViewerQueue
from eco_router.application.errors import TransientError
from eco_router.application.port_values import FeedClosed, FeedGap, LiveEvent
from eco_router.application.ports import EventDecoder, FeedSubscription, GatewayMetrics
from eco_router.domain.sse import GatewayEvent


class Viewer(FeedSubscription):
    """One SSE stream's subscription: its channel, domain and bounded queue."""

    __slots__ = ("_leave", "channel", "domain", "queue")

    def __init__(
        self,
        leave: Callable[[Viewer], Awaitable[None]],
        channel: str,
        domain: str,
        queue: ViewerQueue,
    ) -> None:
        self._leave = leave
        self.channel = channel
        self.domain = domain
        self.queue = queue

    async def next(self, timeout_s: float) -> GatewayEvent | FeedGap | FeedClosed | None:
        return await self.queue.get(timeout_s)

    def next_nowait(self) -> GatewayEvent | None:
        return self.queue.get_nowait()

    def write_through(self, handler: Callable[[LiveEvent], bool] | None) -> None:
        self.queue.write_through = handler

    async def close(self) -> None:
        # Closed from a disconnected client's task while it is being cancelled: leaving (and
        # unsubscribing after the last viewer) must finish all the same.
        await asyncio.shield(self._leave(self))


class ChannelViewers:
    """Who watches which channel, and whether Redis has confirmed each subscription.

    A confirmation for a channel confirmed before means the client subscribed again on a new
    connection, so messages may have been lost in between: its viewers get a gap notice and
    catch up from the job's history.
    """

    def __init__(self, *, decoder: EventDecoder, metrics: GatewayMetrics, queue_size: int) -> None:
        self._decoder = decoder
        self._metrics = metrics
        self._queue_size = queue_size
        self._viewers: defaultdict[str, set[Viewer]] = defaultdict(set)
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._closed = False

    @property
    def channels(self) -> int:
        return len(self._viewers)

    def __contains__(self, channel: str) -> bool:
        return channel in self._viewers

    def queue_lengths(self) -> list[int]:
        """How many events each viewer has waiting now (each at most the queue size)."""
        return [len(v.queue) for viewers in self._viewers.values() for v in viewers]

    def join(
        self, leave: Callable[[Viewer], Awaitable[None]], channel: str, domain: str
    ) -> tuple[Viewer, bool]:
        """A new viewer of `channel`, and whether it is the channel's first (to subscribe)."""
        viewer = Viewer(
            leave,
            channel,
            domain,
            ViewerQueue(maxsize=self._queue_size, on_drop=self._metrics.events_dropped),
        )
        if self._closed:
            viewer.queue.close()
        first = channel not in self._viewers
        self._viewers[channel].add(viewer)
        if first:
            self._confirmed[channel] = asyncio.get_running_loop().create_future()
        return viewer, first

    async def until_confirmed(self, channel: str, timeout_s: float) -> None:
        """Until Redis confirmed the channel's subscription: only then is every later publish
        on it delivered to us. `TransientError` if it could not be, or not in time."""
        confirmed = self._confirmed.get(channel)
        if confirmed is None:
            return
        if confirmed.done():
            # A channel already subscribed (every viewer of a watched job but its first):
            # no timer and no turn of the loop to wait; a refusal is raised as it was set.
            confirmed.result()
            return
        try:
            await asyncio.wait_for(asyncio.shield(confirmed), timeout=timeout_s)
        except TimeoutError as error:
            raise TransientError(f"subscribe {channel}: not confirmed in time") from error

    def leave(self, viewer: Viewer) -> bool:
        """Forget `viewer`; True when it was its channel's last (to unsubscribe)."""
        viewers = self._viewers.get(viewer.channel)
        if viewers is None:
            return False
        viewers.discard(viewer)
        if viewers:
            return False
        del self._viewers[viewer.channel]
        self._confirmed.pop(viewer.channel, None)
        return True

    def subscribed(self, channel: str) -> None:
        """Redis confirmed a subscription of `channel`."""
        confirmed = self._confirmed.get(channel)
        if confirmed is not None and not confirmed.done():
            confirmed.set_result(None)
            return
        self.gap(channel)

    def gap(self, channel: str) -> None:
        """The channel's messages may have been lost: its viewers catch up."""
        for viewer in self._viewers.get(channel, ()):
            viewer.queue.mark_gap("pubsub_reconnect")

    def deliver(self, channel: str, data: object) -> None:
        """A message published on `channel` reaches each of its viewers of the event's domain:
        decoded and encoded once, settled once every viewer has had it."""
        if not isinstance(data, bytes):
            return
        viewers = self._viewers.get(channel)
        if not viewers:
            return
        event = self._decoder.decode(data)
        if event is None:
            return
        live = LiveEvent(event)
        domain = event.domain
        for viewer in viewers:
            if domain is None or viewer.domain == domain:
                viewer.queue.offer(live)
        live.settle()

    def fail_unconfirmed(self, error: Exception, channels: Iterable[str] | None = None) -> None:
        """Viewers still waiting for their subscription to be confirmed are refused now,
        instead of at the confirmation timeout: a SUBSCRIBE written to a dead connection
        raises nothing, only the reader finds out."""
        for channel in self._confirmed if channels is None else channels:
            confirmed = self._confirmed.get(channel)
            if confirmed is not None and not confirmed.done():
                refused = TransientError(f"subscribe {channel}: {error}")
                refused.__cause__ = error
                confirmed.set_exception(refused)
                # Nobody may be waiting any more (the viewer gave up first).
                confirmed.exception()

    def close_all(self) -> None:
        self._closed = True
        for viewers in self._viewers.values():
            for viewer in viewers:
                viewer.queue.close()
