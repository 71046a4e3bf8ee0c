"""Observers of what the routers publish, on a Pub/Sub deployment that may fail over.

A master passes every PUBLISH and SPUBLISH on to its replicas, which deliver it to their own
subscribers. An observer listening on every data node therefore already listens on the
replica a failover promotes: it misses nothing published there while a single subscription
would still be finding the new master. (A pattern subscription does not see sharded
messages: on a Redis Cluster each job's channel is SSUBSCRIBEd on the nodes of its slot.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.streams import key_slot
from eco_router.testing import ClusterGroup, SentinelGroup
from tests.integration.support import CHANNEL_PREFIX, Received, eventually

# How soon a listener dials its node again after losing it (the node may come back).
_REDIAL_S = 0.05


class Collector(Protocol):
    """What the checks read of an observer: every message heard, in the order heard."""

    messages: list[Received]

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def received_keys(self) -> set[tuple[str, int]]: ...


class EveryNodeCollector(Collector):
    """Listens on every data node of a replicated Pub/Sub deployment; `messages` holds each
    message as often as it was heard (once per node that delivered it), in the order heard, so
    a message's first hearing is where the order check places it.

    `listens` maps a node's port to the channels to SSUBSCRIBE there, or to None: PSUBSCRIBE
    every job channel (plain Pub/Sub).
    """

    def __init__(self, listens: Mapping[int, Sequence[str] | None]) -> None:
        self._listens = dict(listens)
        self.messages: list[Received] = []
        self._subscribed: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def on_sentinel(cls, group: SentinelGroup) -> EveryNodeCollector:
        return cls(dict.fromkeys((server.port for server in group.servers), None))

    @classmethod
    def on_cluster(cls, group: ClusterGroup, job_ids: Iterable[str]) -> EveryNodeCollector:
        """Each job's channel on the master serving its slot and on that master's replicas."""
        listens: dict[int, list[str]] = {}
        channels = [f"{CHANNEL_PREFIX}:{job}" for job in job_ids]
        for shard in group.masters():
            mine = [c for c in channels if shard.serves(key_slot(c))]
            for node in (shard.master, *shard.replicas):
                listens[node.port] = mine
        return cls({port: tuple(chans) for port, chans in listens.items() if chans})

    async def __aenter__(self) -> Self:
        self._tasks = [
            asyncio.create_task(self._listen(port, channels), name=f"observer-{port}")
            for port, channels in self._listens.items()
        ]
        await eventually(
            lambda: len(self._subscribed) == len(self._listens), what="every node subscribed"
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await cancel_and_wait(self._tasks)

    def received_keys(self) -> set[tuple[str, int]]:
        return {(m.payload["job_id"], int(m.payload["seq"])) for m in self.messages}

    async def _listen(self, port: int, channels: Sequence[str] | None) -> None:
        while True:
            client = Redis(
                host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1.0
            )
            pubsub = client.pubsub()
            try:
                if channels is None:
                    await pubsub.psubscribe(f"{CHANNEL_PREFIX}:*")
                # One SSUBSCRIBE per channel: the channels of one command must share a slot.
                for channel in channels or ():
                    await pubsub.ssubscribe(channel)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._keep(port, len(channels or "*"), message)
            except (RedisError, OSError):
                await asyncio.sleep(_REDIAL_S)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()

    def _keep(self, port: int, wanted: int, message: dict[str, Any]) -> None:
        if message["type"] in {"psubscribe", "ssubscribe"}:
            # The reply counts this connection's subscriptions so far.
            if message["data"] == wanted:
                self._subscribed.add(port)
        elif message["type"] in {"pmessage", "smessage"}:
            channel = message["channel"]
            self.messages.append(
                Received(
                    channel.decode() if isinstance(channel, bytes) else channel,
                    orjson.loads(message["data"]),
                )
            )
