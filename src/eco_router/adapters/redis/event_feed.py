"""Redis Pub/Sub adapter of `EventFeed`: one connection per process carries every channel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict

from redis.asyncio import Redis

from eco_router.adapters.feed_queue import ViewerQueue
from eco_router.adapters.redis.errors import TRANSIENT_REDIS_ERRORS, redis_errors
from eco_router.application.backoff import Backoff
from eco_router.application.errors import TransientError
from eco_router.application.feed_health import FeedHealth
from eco_router.application.messages import FeedClosed, FeedGap
from eco_router.application.ports import (
    EventDecoder,
    EventFeed,
    FeedSubscription,
    GatewayMetrics,
)
from eco_router.domain.sse import GatewayEvent

log = logging.getLogger(__name__)


class _Viewer(FeedSubscription):
    def __init__(self, feed: RedisPubSubEventFeed, channel: str, domain: str, queue: ViewerQueue):
        self.feed = feed
        self.channel = channel
        self.domain = domain
        self.queue = queue

    async def next(self, timeout_s: float) -> GatewayEvent | FeedGap | FeedClosed | None:
        return await self.queue.get(timeout_s)

    async def close(self) -> None:
        # Closed from a disconnected client's task while it is being cancelled: leaving (and
        # unsubscribing after the last viewer) must finish all the same.
        await asyncio.shield(self.feed.leave(self))


class RedisPubSubEventFeed(EventFeed):
    """Subscribes a job's channel for its first viewer and unsubscribes after its last.

    A reader task fans messages out to the viewers' bounded queues. When the connection
    drops, redis-py re-subscribes on reconnect; each channel's viewers then get a gap notice,
    so they catch up from the history what was published while the connection was down.
    A subscription that cannot be made or confirmed raises `TransientError` and leaves
    nothing behind.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        channel_prefix: str,
        decoder: EventDecoder,
        metrics: GatewayMetrics,
        queue_size: int = 256,
        confirm_timeout_s: float = 10.0,
        health: FeedHealth | None = None,
    ) -> None:
        self._pubsub = redis.pubsub()
        self._health = health or FeedHealth()
        self._confirm_timeout_s = confirm_timeout_s
        self._prefix = channel_prefix
        self._decoder = decoder
        self._metrics = metrics
        self._queue_size = queue_size
        self._viewers: defaultdict[str, set[_Viewer]] = defaultdict(set)
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._lock = asyncio.Lock()
        self._has_channels = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def channels(self) -> int:
        return len(self._viewers)

    def queue_lengths(self) -> list[int]:
        """How many events each viewer has waiting now (each at most the queue size)."""
        return [len(v.queue) for viewers in self._viewers.values() for v in viewers]

    async def start(self) -> None:
        self._health.started()
        self._reader = asyncio.create_task(self._read(), name="pubsub-feed")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        channel = f"{self._prefix}:{job_id}"
        viewer = _Viewer(
            self,
            channel,
            domain,
            ViewerQueue(maxsize=self._queue_size, on_drop=self._metrics.events_dropped),
        )
        if self._closed:
            viewer.queue.close()
        try:
            async with self._lock:
                first = channel not in self._viewers
                self._viewers[channel].add(viewer)
                if first:
                    loop = asyncio.get_running_loop()
                    confirmed = self._confirmed[channel] = loop.create_future()
                    with redis_errors(f"subscribe {channel}"):
                        await self._pubsub.subscribe(channel)
                    self._has_channels.set()
                else:
                    confirmed = self._confirmed.get(channel) or _done_future()
            # Only once Redis confirms is every later publish on the channel delivered to us.
            try:
                await asyncio.wait_for(asyncio.shield(confirmed), timeout=self._confirm_timeout_s)
            except TimeoutError as error:
                raise TransientError(f"subscribe {channel}: not confirmed in time") from error
        except BaseException:
            await asyncio.shield(self.leave(viewer))
            raise
        return viewer

    def close_viewers(self) -> None:
        self._closed = True
        for viewers in self._viewers.values():
            for viewer in viewers:
                viewer.queue.close()

    async def leave(self, viewer: _Viewer) -> None:
        async with self._lock:
            viewers = self._viewers.get(viewer.channel)
            if viewers is None:
                return
            viewers.discard(viewer)
            if not viewers:
                del self._viewers[viewer.channel]
                self._confirmed.pop(viewer.channel, None)
                with contextlib.suppress(*TRANSIENT_REDIS_ERRORS):
                    await self._pubsub.unsubscribe(viewer.channel)

    async def _read(self) -> None:
        backoff = Backoff(initial_s=0.05, max_s=2.0)
        while True:
            if not self._pubsub.subscribed:
                self._has_channels.clear()
                await self._has_channels.wait()
            try:
                message = await self._pubsub.get_message(timeout=1.0)
                if backoff.failing:
                    log.info("Pub/Sub reader back")
                    self._health.recovered()
                backoff.reset()
            except TRANSIENT_REDIS_ERRORS as error:
                if not backoff.failing:
                    log.warning("Pub/Sub connection lost, reconnecting: %s", error)
                    self._metrics.feed_failed()
                self._health.failing(f"Pub/Sub connection lost: {error}")
                self._fail_unconfirmed(error)
                await asyncio.sleep(backoff.next_delay())
                continue
            except Exception as error:
                # A refused subscription (an ACL without the channel) or a reply the client
                # cannot parse: the reader stays, or every later viewer would wait in vain.
                if not backoff.failing:
                    name = type(error).__name__
                    log.error("Pub/Sub reader failed, retrying: %s: %s", name, error)
                    self._metrics.feed_failed()
                self._health.failing(f"Pub/Sub reader failed: {type(error).__name__}: {error}")
                self._fail_unconfirmed(error)
                await asyncio.sleep(backoff.next_delay())
                continue
            if message is not None:
                self._dispatch(message)

    def _fail_unconfirmed(self, error: Exception) -> None:
        """Viewers still waiting for their subscription to be confirmed are refused now,
        instead of at the confirmation timeout: a SUBSCRIBE written to a dead connection
        raises nothing, only the reader finds out."""
        for channel, confirmed in self._confirmed.items():
            if not confirmed.done():
                confirmed.set_exception(TransientError(f"subscribe {channel}: {error}"))

    def _dispatch(self, message: dict[str, object]) -> None:
        kind = message.get("type")
        channel = _text(message.get("channel"))
        if kind == b"subscribe" or kind == "subscribe":
            confirmed = self._confirmed.get(channel)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)
            else:
                # Confirmed again: redis-py re-subscribed on a new connection (even when it
                # reconnected without raising), so messages may have been lost in between.
                for viewer in self._viewers.get(channel, ()):
                    viewer.queue.mark_gap("pubsub_reconnect")
            return
        if kind not in (b"message", "message"):
            return
        data = message.get("data")
        if not isinstance(data, bytes):
            return
        event = self._decoder.decode(data)
        if event is None:
            return
        for viewer in self._viewers.get(channel, ()):
            if event.belongs_to(viewer.domain):
                viewer.queue.put(event)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _done_future() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future
