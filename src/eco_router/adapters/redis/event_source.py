"""Redis Streams consumer-group adapter of `EventSource`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from eco_router.adapters.redis.errors import transient_errors
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.messages import (
    ClaimPage,
    Delivery,
    ShardStats,
    entries_of_jobs,
    first_entries,
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
        self._older_pending_jobs = redis.register_script(load_lua("older_pending_jobs.lua"))

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

    async def read_new(self, *, count: int, block_ms: int) -> list[Delivery]:
        streams = dict.fromkeys(self._family_of, ">")
        reply = await self._xreadgroup(streams, count=count, block_ms=block_ms)
        return [d for stream, entries in reply for d in self._deliveries(stream, entries)]

    async def overtaking(
        self, deliveries: Sequence[Delivery], *, max_idle_ms: int
    ) -> set[tuple[str, str]]:
        first = first_entries(deliveries)
        if not first:
            return set()
        streams = list(first)
        args: list[str | int] = [self._group, self._consumer, max_idle_ms]
        args += [first[s] for s in streams]
        with transient_errors("look for older pending entries"):
            reply = await self._older_pending_jobs(keys=streams, args=args)
        held = {(s, job) for s, jobs in zip(streams, reply, strict=True) for job in jobs}
        return entries_of_jobs(deliveries, held)

    async def read_own_pending(self, *, after: Mapping[str, str], count: int) -> list[Delivery]:
        streams = {s: after.get(s, "0-0") for s in self._family_of}
        reply = await self._xreadgroup(streams, count=count, block_ms=None)
        deliveries = [d for stream, entries in reply for d in self._deliveries(stream, entries)]
        return await self._with_delivery_counts(deliveries)

    async def claim_idle(
        self, stream: str, *, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        with transient_errors(f"XAUTOCLAIM {stream}"):
            try:
                reply = await self._redis.xautoclaim(
                    stream, self._group, self._consumer, min_idle_ms, cursor, count=count
                )
            except ResponseError as error:
                if not _is_nogroup(error):
                    raise
                await self.prepare()
                return ClaimPage([], "0-0")
        next_cursor, entries = reply[0], reply[1]
        deleted: list[bytes] = reply[2] if len(reply) > 2 else []
        claimed = await self._with_delivery_counts(self._deliveries(stream, entries))
        family = self._family_of[stream]
        gone = [Delivery(family, stream, _text(i), None) for i in deleted]
        return ClaimPage(claimed + gone, _text(next_cursor))

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

    async def _xreadgroup(
        self, streams: dict[str, str], *, count: int, block_ms: int | None
    ) -> list[tuple[bytes, list[RawEntry]]]:
        with transient_errors("XREADGROUP"):
            try:
                return await self._call_xreadgroup(streams, count=count, block_ms=block_ms)
            except ResponseError as error:
                if not _is_nogroup(error):
                    raise
                # A stream or group deleted under us: re-create and read again.
                await self.prepare()
                return await self._call_xreadgroup(streams, count=count, block_ms=block_ms)

    async def _call_xreadgroup(
        self, streams: dict[str, str], *, count: int, block_ms: int | None
    ) -> list[tuple[bytes, list[RawEntry]]]:
        reply: Any = await self._redis.xreadgroup(
            self._group,
            self._consumer,
            streams,  # type: ignore[arg-type]
            count=count,
            # BLOCK 0 waits forever in Redis; the port's 0 means "do not wait".
            block=block_ms or None,
        )
        if not reply:
            return []
        if isinstance(reply, dict):  # RESP3 shape
            return [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
        return [(stream, entries) for stream, entries in reply]

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

    async def _with_delivery_counts(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Attach each entry's delivery count (one pipelined XPENDING per entry, rare path)."""
        if not deliveries:
            return deliveries
        with transient_errors("XPENDING"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for d in deliveries:
                    pipe.xpending_range(d.stream, self._group, d.entry_id, d.entry_id, 1)
                replies = await pipe.execute()
        counted = []
        for delivery, reply in zip(deliveries, replies, strict=True):
            times = int(reply[0]["times_delivered"]) if reply else delivery.delivery_count
            counted.append(dataclasses.replace(delivery, delivery_count=times))
        return counted


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _is_nogroup(error: ResponseError) -> bool:
    # A read blocked on a stream that gets deleted ends with UNBLOCKED, not NOGROUP.
    return str(error).startswith(("NOGROUP", "UNBLOCKED"))


def _find_group(reply: object, group: str) -> dict[str, Any] | None:
    if not isinstance(reply, list):
        return None
    for info in reply:
        if isinstance(info, dict) and _text(info.get("name", b"")) == group:
            return info
    return None
