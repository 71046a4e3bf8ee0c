"""Redis Streams consumer-group adapter of `EventSource`."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from eco_router.adapters.redis.errors import transient_errors
from eco_router.adapters.redis.keys import GroupKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.messages import (
    ClaimPage,
    Delivery,
    ReadBatch,
    ShardStats,
    drained_marks,
    first_ids,
)
from eco_router.application.ports import EventSource
from eco_router.domain.streams import StreamFamily, shard_of

RawEntry = tuple[bytes | None, dict[bytes, bytes] | None]


class RedisStreamEventSource(EventSource):
    """Reads every shard of every family with XREADGROUP as one consumer of one group."""

    def __init__(
        self, redis: Redis, *, families: Sequence[StreamFamily], group: str, consumer: str
    ) -> None:
        self._redis = redis
        self._families = tuple(families)
        self._group = group
        self._consumer = consumer
        self._family_of = {s: f for f in self._families for s in f.streams}
        self._keys = GroupKeys(group)
        self._claim_held = redis.register_script(load_lua("claim_held.lua"))

    @property
    def families(self) -> tuple[StreamFamily, ...]:
        return self._families

    async def prepare(self) -> None:
        with transient_errors("create consumer groups"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream in self._family_of:
                    pipe.xgroup_create(stream, self._group, id="0", mkstream=True)
                replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, ResponseError) and "BUSYGROUP" not in str(reply):
                raise reply

    async def read_new(self, after: Mapping[str, str], *, count: int) -> ReadBatch:
        streams = list(after)
        if not streams:
            return ReadBatch([])
        replies = await self._nogroup_retried(
            "XREADGROUP", lambda: self._read_and_look_behind(after, count)
        )
        deliveries = [
            d for stream, entries in replies[0] for d in self._deliveries(stream, entries)
        ]
        first = first_ids(deliveries)
        gaps = frozenset(
            stream
            for stream, pending in zip(streams, replies[1:], strict=True)
            if pending
            and (
                _text(pending[0]["consumer"]) != self._consumer
                or _text(pending[0]["message_id"]) != first.get(stream)
            )
        )
        return ReadBatch(deliveries, gaps, drained_marks(deliveries, after, count))

    async def _read_and_look_behind(self, after: Mapping[str, str], count: int) -> list[Any]:
        """XREADGROUP, then per shard the first entry pending after `after`: the read's own
        first entry, one another consumer took before it, or one an earlier read of this
        consumer took whose reply was lost (and the client retried). It is looked up after
        the read, so nothing read before it goes unseen."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xreadgroup(self._group, self._consumer, dict.fromkeys(after, ">"), count=count)
            for stream, last in after.items():
                pipe.xpending_range(stream, self._group, min=f"({last}", max="+", count=1)
            replies: list[Any] = await pipe.execute()
        read = replies[0] or []
        if isinstance(read, dict):  # RESP3 shape
            read = [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in read.items()]
        return [list(read), *replies[1:]]

    async def wait_for_new(self, marks: Mapping[str, str], *, block_ms: int) -> None:
        if not marks:
            return
        with transient_errors("XREAD"):
            await self._redis.xread(dict(marks), count=1, block=block_ms)  # type: ignore[arg-type]

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        args: list[str | int] = [self._group, self._consumer, token, min_idle_ms, cursor, count]
        keys = [self._keys.epoch(stream), stream]
        reply = await self._nogroup_retried(
            f"claim on {stream}", lambda: self._claim_held(keys=keys, args=args)
        )
        if reply is None:
            return ClaimPage([], "0-0", fenced=True)
        next_cursor, entries, deleted, counts, last_delivered = reply
        family = self._family_of[stream]
        found = self._deliveries(stream, [_entry(e) for e in entries])
        claimed = [
            dataclasses.replace(d, delivery_count=int(n))
            for d, n in zip(found, counts, strict=True)
        ]
        gone = [Delivery(family, stream, _text(i), None) for i in deleted]
        position = _text(last_delivered) if last_delivered else None
        return ClaimPage(claimed + gone, _text(next_cursor), last_delivered=position)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        ids: dict[str, list[str]] = {}
        for delivery in deliveries:
            ids.setdefault(delivery.stream, []).append(delivery.entry_id)
        with transient_errors("XACK"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream, entry_ids in ids.items():
                    pipe.xack(stream, self._group, *entry_ids)
                await pipe.execute()

    async def shard_stats(self) -> list[ShardStats]:
        with transient_errors("XINFO GROUPS"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream in self._family_of:
                    pipe.xinfo_groups(stream)
                replies = await pipe.execute(raise_on_error=False)
        stats = []
        for stream, reply in zip(self._family_of, replies, strict=True):
            group = _find_group(reply, self._group)
            lag = group.get("lag") if group else None
            stats.append(
                ShardStats(
                    family=self._family_of[stream],
                    stream=stream,
                    shard=shard_of(stream),
                    lag=int(lag) if lag is not None else None,
                    pending=int(group.get("pending", 0)) if group else 0,
                )
            )
        return stats

    async def ping(self) -> None:
        with transient_errors("PING streams server"):
            await self._redis.ping()

    async def _nogroup_retried(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        with transient_errors(what):
            try:
                return await call()
            except ResponseError as error:
                if not _is_nogroup(error):
                    raise
                # A stream or group deleted under us: re-create and go on.
                await self.prepare()
                return await call()

    def _deliveries(self, stream: bytes | str, entries: Sequence[RawEntry]) -> list[Delivery]:
        name = _text(stream)
        family = self._family_of[name]
        # redis-py turns the nil fields of an entry deleted while pending into {}; a real
        # entry always has at least one field.
        return [
            Delivery(family, name, _text(entry_id), fields or None)
            for entry_id, fields in entries
            if entry_id is not None
        ]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _is_nogroup(error: ResponseError) -> bool:
    # Inside a script the error is NOGROUP too, wherever Redis puts the script's name.
    return "NOGROUP" in str(error)


def _entry(raw: list[Any]) -> RawEntry:
    """A script's [id, [field, value, ...]] entry as redis-py shapes a read's entries."""
    entry_id, flat = raw
    return entry_id, dict(zip(flat[::2], flat[1::2], strict=True)) if flat else None


def _find_group(reply: object, group: str) -> dict[str, Any] | None:
    if not isinstance(reply, list):
        return None
    for info in reply:
        if isinstance(info, dict) and _text(info.get("name", b"")) == group:
            return info
    return None
