"""Redis Pub/Sub adapter of `EventFeed`: one connection per process carries every channel."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis

from eco_router.adapters.redis.errors import is_transient, port_error, redis_errors
from eco_router.adapters.redis.gateway.channel_viewers import ChannelViewers, Viewer
from eco_router.application.backoff import Backoff
from eco_router.application.errors import TransientError
from eco_router.application.feed_health import FeedHealth
from eco_router.application.ports import (
    EventDecoder,
    EventFeed,
    FeedSubscription,
    GatewayMetrics,
)
from eco_router.application.stopping import cancel_and_wait

log = logging.getLogger(__name__)


class RedisPubSubEventFeed(EventFeed):
    """Subscribes a job's channel for its first viewer and unsubscribes after its last.

    A reader task fans messages out to the viewers' bounded queues. When the connection
    drops, redis-py re-subscribes on reconnect; each channel's viewers then get a gap notice,
    so they catch up from the history what was published while the connection was down.
    A subscription that cannot be made or confirmed raises `TransientError` and leaves
    nothing behind. The channels of viewers joining together (a burst of browsers opening
    their streams) go out in one SUBSCRIBE.
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
        self._metrics = metrics
        self._viewers = ChannelViewers(decoder=decoder, metrics=metrics, queue_size=queue_size)
        self._lock = asyncio.Lock()
        self._to_subscribe: list[str] = []
        self._subscribing: asyncio.Task[None] | None = None
        self._has_channels = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def channels(self) -> int:
        return self._viewers.channels

    def queue_lengths(self) -> list[int]:
        """How many events each viewer has waiting now (each at most the queue size)."""
        return self._viewers.queue_lengths()

    async def start(self) -> None:
        self._health.started()
        self._reader = asyncio.create_task(self._read(), name="pubsub-feed")

    async def stop(self) -> None:
        if self._reader is not None:
            await cancel_and_wait([self._reader])
        # Under the lock: closing the connection under a running unsubscribe fails it.
        async with self._lock:
            self._stopped = True
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        channel = f"{self._prefix}:{job_id}"
        viewer, first = self._viewers.join(self.leave, channel, domain)
        try:
            if first:
                self._subscribe_soon(channel)
            await self._viewers.until_confirmed(channel, self._confirm_timeout_s)
        except BaseException:
            await asyncio.shield(self.leave(viewer))
            raise
        return viewer

    def _subscribe_soon(self, channel: str) -> None:
        """SUBSCRIBE `channel` with the others asked for in this turn of the loop, in one
        command sent by a task of the feed's own (a viewer that gives up meanwhile cancels
        nothing of the others'); a failure fails their confirmations."""
        self._to_subscribe.append(channel)
        if self._subscribing is None or self._subscribing.done():
            self._subscribing = asyncio.create_task(self._subscribe_asked(), name="subscribe")

    async def _subscribe_asked(self) -> None:
        # Channels asked for while a SUBSCRIBE was on its way go in the next one.
        while self._to_subscribe:
            async with self._lock:
                channels = [c for c in dict.fromkeys(self._to_subscribe) if c in self._viewers]
                self._to_subscribe = []
                if not channels or self._stopped:
                    continue
                try:
                    with redis_errors(f"subscribe {len(channels)} channels"):
                        await self._pubsub.subscribe(*channels)
                except Exception as error:
                    self._viewers.fail_unconfirmed(error, channels)
                    continue
                self._has_channels.set()

    def close_viewers(self) -> None:
        self._viewers.close_all()

    async def leave(self, viewer: Viewer) -> None:
        async with self._lock:
            # A closed connection has dropped every subscription: nothing left to unsubscribe.
            # A lost one drops them too; it fails whatever way the loop tells it (redis-py's
            # ConnectionError, or a write on a connection closed under it: see errors.py).
            if self._viewers.leave(viewer) and not self._stopped:
                with contextlib.suppress(TransientError), redis_errors("unsubscribe"):
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
                    self._metrics.feed_recovered()
                backoff.reset()
            except Exception as error:
                # A lost connection (however it fails), or a refused subscription (an ACL
                # without the channel) or a reply the client cannot parse: the reader stays,
                # or every later viewer would wait in vain.
                self._failed(error, logged=backoff.failing)
                await asyncio.sleep(backoff.next_delay())
                continue
            if message is not None:
                self._dispatch(message)

    def _failed(self, error: Exception, *, logged: bool) -> None:
        """The reader failed: health and metrics say so, viewers waiting are refused (503)."""
        name = type(error).__name__
        if is_transient(error):
            if not logged:
                log.warning("Pub/Sub connection lost, reconnecting: %s: %s", name, error)
            self._health.failing(f"Pub/Sub connection lost: {name}: {error}")
        else:
            if not logged:
                log.error("Pub/Sub reader failed, retrying: %s: %s", name, error)
            self._health.failing(f"Pub/Sub reader failed: {name}: {error}")
        if not logged:
            self._metrics.feed_failed()
        self._viewers.fail_unconfirmed(port_error(error, "read Pub/Sub"))

    def _dispatch(self, message: dict[str, object]) -> None:
        kind = message.get("type")
        channel = _text(message.get("channel"))
        if kind == b"subscribe" or kind == "subscribe":
            # Confirmed again: redis-py re-subscribed on a new connection (even when it
            # reconnected without raising), so messages may have been lost in between.
            self._viewers.subscribed(channel)
        elif kind == b"message" or kind == "message":
            self._viewers.deliver(channel, message.get("data"))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
