"""Redis Streams consumer-group adapter of `EventSource`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Coroutine, Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from eco_router.adapters.redis.connection import RedisClient
from eco_router.adapters.redis.errors import port_error, redis_errors
from eco_router.adapters.redis.keys import GroupKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.adapters.redis.slots import by_slot, on_node_of
from eco_router.application.errors import PermanentError, TransientError
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
        self, redis: RedisClient, *, families: Sequence[StreamFamily], group: str, consumer: str
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

    async def prepare(self, streams: Collection[str] | None = None) -> dict[str, PermanentError]:
        broken, _ = await self._create_groups(dict.fromkeys(streams or self._family_of, "0"))
        return broken

    async def _create_groups(
        self, at: Mapping[str, str]
    ) -> tuple[dict[str, PermanentError], list[str]]:
        """XGROUP CREATE ... MKSTREAM on each stream at its id; BUSYGROUP is fine. Returns
        the streams refused for good and those where the group was created."""
        with redis_errors("create consumer groups"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream, entry_id in at.items():
                    pipe.xgroup_create(stream, self._group, id=entry_id, mkstream=True)
                replies = await pipe.execute(raise_on_error=False)
        broken: dict[str, PermanentError] = {}
        created: list[str] = []
        for stream, reply in zip(at, replies, strict=True):
            if not isinstance(reply, Exception):
                created.append(stream)
            elif "BUSYGROUP" not in str(reply):
                broken[stream] = _refused(reply, "XGROUP CREATE", stream)
        return broken, created

    async def read_new(self, after: Mapping[str, str], *, count: int) -> ReadBatch:
        if not after:
            return ReadBatch([])
        # Tagged shards live in different slots, which one XREADGROUP cannot span.
        together = len(by_slot(after)) == 1
        reads, pending = await self._read_and_look_behind(after, count, together=together)
        regrouped: dict[str, str] = {}
        vanished = {
            stream: after[stream]
            for stream, read in zip(after, reads, strict=True)
            if isinstance(read, ResponseError) and _is_nogroup(read)
        }
        if vanished:
            positions = await self._positions(vanished)
            _, created = await self._create_groups(positions)
            regrouped = {stream: positions[stream] for stream in created}
            # Only the shards that read nothing are read again: the others' entries are
            # this consumer's pending ones now, which a second read would not return.
            again = await self._read_and_look_behind(vanished, count, together=together)
            redone = dict(zip(vanished, zip(*again, strict=True), strict=True))
            reads = [redone[s][0] if s in redone else r for s, r in zip(after, reads, strict=True)]
            pending = [
                redone[s][1] if s in redone else p for s, p in zip(after, pending, strict=True)
            ]
        if together and isinstance(reads[0], Exception):
            error = port_error(reads[0], "XREADGROUP")
            if not isinstance(error, PermanentError):
                raise error from reads[0]
            # One XREADGROUP reads every shard or none: find the shard it failed on.
            reads, pending = await self._read_and_look_behind(after, count, together=False)
        broken = {}
        deliveries: list[Delivery] = []
        for stream, read in zip(after, reads, strict=True):
            if isinstance(read, Exception):
                broken[stream] = _refused(read, "XREADGROUP", stream)
                continue
            deliveries += [d for name, entries in read for d in self._deliveries(name, entries)]
        first = first_ids(deliveries)
        gaps = set()
        for stream, found in zip(after, pending, strict=True):
            if stream in broken or (isinstance(found, Exception) and _is_nogroup(found)):
                continue
            if isinstance(found, Exception):
                broken[stream] = _refused(found, "XPENDING", stream)
            elif found and (
                _text(found[0]["consumer"]) != self._consumer
                or _text(found[0]["message_id"]) != first.get(stream)
            ):
                gaps.add(stream)
        return ReadBatch(
            deliveries,
            frozenset(gaps),
            drained_marks(deliveries, {s: i for s, i in after.items() if s not in broken}, count),
            broken,
            regrouped,
        )

    async def _positions(self, after: Mapping[str, str]) -> dict[str, str]:
        """Where to create a vanished group again: a group destroyed under us goes back to
        the position this consumer had read to, so nothing routed already is read again (and
        nothing appended since is lost); a stream deleted with its group (the entry at the
        position is gone) is read from its start."""
        with redis_errors("XRANGE"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream, last in after.items():
                    pipe.xrange(stream, last, last, count=1)
                found = await pipe.execute(raise_on_error=False)
        return {
            stream: last if isinstance(entries, list) and entries else "0"
            for (stream, last), entries in zip(after.items(), found, strict=True)
        }

    async def _read_and_look_behind(
        self, after: Mapping[str, str], count: int, *, together: bool
    ) -> tuple[list[Any], list[Any]]:
        """XREADGROUP (one for every shard `together`, else one per shard), then per shard
        the first entry pending after `after`: the read's own first entry, one another
        consumer took before it, or one an earlier read of this consumer took whose reply was
        lost (and the client retried). It is looked up after the read, so nothing read
        before it goes unseen. Replies per shard, an exception where a command failed."""
        with redis_errors("XREADGROUP"):
            async with self._redis.pipeline(transaction=False) as pipe:
                if together:
                    pipe.xreadgroup(
                        self._group, self._consumer, dict.fromkeys(after, ">"), count=count
                    )
                else:
                    for stream in after:
                        pipe.execute_command(
                            "XREADGROUP",
                            *("GROUP", self._group, self._consumer, "COUNT", count),
                            *("STREAMS", stream, ">"),
                            **on_node_of(self._redis, stream),
                        )
                for stream, last in after.items():
                    pipe.xpending_range(stream, self._group, min=f"({last}", max="+", count=1)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
        if not together:
            reads = [
                r if isinstance(r, Exception) else _read_reply(r) for r in replies[: len(after)]
            ]
            return reads, replies[len(after) :]
        if isinstance(replies[0], Exception):
            return [replies[0]] * len(after), replies[1:]
        by_stream = {_text(name): entries for name, entries in _read_reply(replies[0])}
        return [[(s, by_stream[s])] if s in by_stream else [] for s in after], replies[1:]

    async def wait_for_new(self, marks: Mapping[str, str], *, block_ms: int) -> None:
        if not marks:
            return
        slots = by_slot(marks)
        try:
            with redis_errors("XREAD"):
                if len(slots) == 1:
                    await self._wait(marks, block_ms)
                else:
                    await _first_of([self._wait(part, block_ms) for part in slots])
        except PermanentError:
            # A shard refused for good: the read that follows tells which one.
            return

    async def _wait(self, marks: Mapping[str, str], block_ms: int) -> None:
        args: list[str | int] = ["COUNT", 1, "BLOCK", block_ms, "STREAMS", *marks]
        args += marks.values()
        await self._redis.execute_command(
            "XREAD", *args, **on_node_of(self._redis, next(iter(marks)))
        )

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        args: list[str | int] = [self._group, self._consumer, token, min_idle_ms, cursor, count]
        keys = [self._keys.epoch(stream), stream]
        with redis_errors(f"claim on {stream}", key=stream):
            try:
                reply = await self._claim_held(keys=keys, args=args)
            except ResponseError as error:
                if not _is_nogroup(error):
                    raise
                # No group, nothing pending: the next read creates it at this consumer's
                # position.
                return ClaimPage([], "0-0")
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
        with redis_errors("XACK"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream, entry_ids in ids.items():
                    pipe.xack(stream, self._group, *entry_ids)
                replies = await pipe.execute(raise_on_error=False)
        for stream, reply in zip(ids, replies, strict=True):
            if isinstance(reply, Exception):
                raise port_error(reply, "XACK", key=stream) from reply

    async def shard_stats(self) -> list[ShardStats]:
        with redis_errors("XINFO GROUPS"):
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
        with redis_errors("PING streams server"):
            await self._redis.ping()

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


async def _first_of(waits: list[Coroutine[Any, Any, None]]) -> None:
    """Until the first of `waits` returns (or fails); the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _refused(reply: Exception, what: str, stream: str) -> PermanentError:
    """The permanent error a failed command of a pipeline stands for; a transient one is
    raised, as it concerns every shard."""
    error = port_error(reply, what, key=stream)
    if isinstance(error, TransientError):
        raise error from reply
    return error


def _read_reply(reply: Any) -> list[Any]:
    """XREADGROUP's reply as [(stream, entries), ...], whichever protocol gave it."""
    if isinstance(reply, dict):  # RESP3 shape
        return [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
    return list(reply or [])


def _is_nogroup(error: Exception) -> bool:
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
