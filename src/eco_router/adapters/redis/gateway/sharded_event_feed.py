"""Sharded Pub/Sub adapter of `EventFeed` for a Redis Cluster: one connection per node."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from eco_router.adapters.redis.errors import redis_errors
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


class _NodePubSub(PubSub):
    """A node's Pub/Sub connection that re-subscribes its shard channels one slot at a time
    after a reconnect: one SSUBSCRIBE may not span slots."""

    async def _resubscribe_shard_channels(self) -> None:
        by_slot: defaultdict[int, dict[Any, Any]] = defaultdict(dict)
        for channel, handler in self.shard_channels.items():
            by_slot[key_slot(self.encoder.encode(channel))][channel] = handler
        for subscriptions in by_slot.values():
            await self._resubscribe(subscriptions, self.ssubscribe)


class _Link:
    """The connection to one node and the channels it carries for this process."""

    def __init__(self, node: ClusterNode) -> None:
        self.name = node.name
        self.pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
        self.pubsub = _NodePubSub(connection_pool=self.pool)
        self.channels: set[str] = set()
        self.reader: asyncio.Task[None] | None = None
        # Set once a subscription went out: reading needs the connection it opened.
        self.subscribing = asyncio.Event()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.pubsub.aclose()  # type: ignore[no-untyped-call]
        with contextlib.suppress(Exception):
            await self.pool.aclose()


class RedisShardedPubSubEventFeed(EventFeed):
    """SSUBSCRIBEs a job's channel, on the node owning its slot, for its first viewer.

    One connection per node carries that node's channels, with one reader task each. When a
    node's connection fails (a failover, a restart, a moved slot), its channels are
    subscribed again where the cluster now says they live, and their viewers get a gap
    notice, so they catch up from the job's history.
    """

    def __init__(
        self,
        cluster: RedisCluster,
        *,
        channel_prefix: str,
        decoder: EventDecoder,
        metrics: GatewayMetrics,
        queue_size: int = 256,
        confirm_timeout_s: float = 10.0,
        health: FeedHealth | None = None,
    ) -> None:
        self._cluster = cluster
        self._prefix = channel_prefix
        self._metrics = metrics
        self._health = health or FeedHealth()
        self._confirm_timeout_s = confirm_timeout_s
        self._viewers = ChannelViewers(decoder=decoder, metrics=metrics, queue_size=queue_size)
        self._links: dict[str, _Link] = {}
        self._home: dict[str, _Link] = {}
        self._orphans: set[str] = set()
        self._orphaned = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopped = False
        self._repairer: asyncio.Task[None] | None = None

    @property
    def channels(self) -> int:
        return self._viewers.channels

    def queue_lengths(self) -> list[int]:
        return self._viewers.queue_lengths()

    async def start(self) -> None:
        self._health.started()
        with redis_errors("discover the Pub/Sub cluster"):
            await self._cluster.initialize()
        self._repairer = asyncio.create_task(self._repair(), name="sharded-feed-repair")

    async def stop(self) -> None:
        tasks = [t for t in (self._repairer, *(k.reader for k in self._links.values())) if t]
        await cancel_and_wait(tasks)
        # Under the lock: closing a link under a running sunsubscribe fails it.
        async with self._lock:
            self._stopped = True
            for link in list(self._links.values()):
                await link.close()
            self._links.clear()

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        channel = f"{self._prefix}:{job_id}"
        viewer, first = self._viewers.join(self.leave, channel, domain)
        try:
            if first:
                async with self._lock:
                    with redis_errors(f"subscribe {channel}"):
                        await self._place(channel)
            await self._viewers.until_confirmed(channel, self._confirm_timeout_s)
        except BaseException:
            await asyncio.shield(self.leave(viewer))
            raise
        return viewer

    def close_viewers(self) -> None:
        self._viewers.close_all()

    async def leave(self, viewer: Viewer) -> None:
        async with self._lock:
            if not self._viewers.leave(viewer):
                return
            self._orphans.discard(viewer.channel)
            link = self._home.pop(viewer.channel, None)
            # Closed links have dropped every subscription: nothing left to unsubscribe.
            if link is not None and not self._stopped:
                link.channels.discard(viewer.channel)
                # However the loop tells of a lost connection: see errors.py.
                with contextlib.suppress(TransientError), redis_errors("sunsubscribe"):
                    await link.pubsub.sunsubscribe(viewer.channel)

    async def _place(self, channel: str) -> None:
        """Subscribe `channel` on the node that owns its slot now (called under the lock)."""
        node = self._cluster.get_node_from_key(channel)
        if node is None:
            raise TransientError(f"subscribe {channel}: no node serves its slot")
        link = self._links.get(node.name)
        if link is None:
            link = self._links[node.name] = _Link(node)
            link.reader = asyncio.create_task(self._read(link), name=f"sharded-feed-{node.name}")
        try:
            await link.pubsub.ssubscribe(channel)
        except BaseException:
            if not link.subscribing.is_set():
                # Its reader never started reading: nothing else will close it.
                del self._links[node.name]
                if link.reader is not None:
                    link.reader.cancel()
                await link.close()
            raise
        link.channels.add(channel)
        self._home[channel] = link
        link.subscribing.set()

    async def _read(self, link: _Link) -> None:
        await link.subscribing.wait()
        while True:
            try:
                message = await link.pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                await self._lose(link, error)
                return
            if message is not None:
                self._dispatch(message)

    async def _lose(self, link: _Link, error: Exception) -> None:
        """The node's connection failed: its channels go back to be placed again."""
        if not self._orphans:
            log.warning("Pub/Sub connection to %s lost, resubscribing: %s", link.name, error)
            self._metrics.feed_failed()
        self._health.failing(f"Pub/Sub connection to {link.name} lost: {error}")
        async with self._lock:
            if self._links.get(link.name) is link:
                del self._links[link.name]
            for channel in link.channels:
                if self._home.get(channel) is link:
                    del self._home[channel]
                    self._orphans.add(channel)
            self._viewers.fail_unconfirmed(error, link.channels)
            link.channels.clear()
        self._orphaned.set()
        await link.close()

    async def _repair(self) -> None:
        """Places orphaned channels again, with back-off while the cluster cannot take them."""
        backoff = Backoff(initial_s=0.05, max_s=2.0)
        while True:
            await self._orphaned.wait()
            await asyncio.sleep(backoff.next_delay())
            try:
                # A failover moves slots to a new node: ask the cluster where they are now.
                await self._cluster.nodes_manager.initialize()
                async with self._lock:
                    for channel in sorted(self._orphans):
                        if channel in self._viewers:
                            await self._place(channel)
                        self._orphans.discard(channel)
            except Exception as error:
                log.debug("Pub/Sub resubscription deferred: %s", error)
                continue
            if not self._orphans:
                self._orphaned.clear()
                backoff.reset()
                log.info("Pub/Sub reader back")
                self._health.recovered()
                self._metrics.feed_recovered()

    def _dispatch(self, message: dict[str, object]) -> None:
        kind = _text(message.get("type"))
        channel = _text(message.get("channel"))
        if kind == "ssubscribe":
            # Confirmed again (a new connection): messages may have been lost in between.
            self._viewers.subscribed(channel)
        elif kind == "smessage":
            self._viewers.deliver(channel, message.get("data"))
        elif kind == "sunsubscribe" and channel in self._viewers:
            # Unasked for: the channel's slot moved to another node, which has it now.
            self._viewers.gap(channel)
            link = self._home.pop(channel, None)
            if link is not None:
                link.channels.discard(channel)
            self._orphans.add(channel)
            self._orphaned.set()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
