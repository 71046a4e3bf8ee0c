"""Redis Streams consumer-group adapter of `EventSource`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from eco_router.adapters.redis.connections.connection import PinnedReader, RedisClient
from eco_router.adapters.redis.connections.round_trips import HeldConnection, round_trips
from eco_router.adapters.redis.connections.slots import by_slot, on_node_of
from eco_router.adapters.redis.errors import port_error, redis_errors
from eco_router.adapters.redis.keys import GroupKeys
from eco_router.adapters.redis.router.look_behind import LookBehind
from eco_router.adapters.redis.router.unblocker import Unblocker
from eco_router.adapters.redis.scripts import load_lua
from eco_router.adapters.waited_reads import WaitedReads
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.port_values import (
    ClaimPage,
    Delivery,
    ReadBatch,
    ShardStats,
    drained_marks,
    first_ids,
    read_starts,
)
from eco_router.application.ports import EventSource
from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.streams import StreamFamily, shard_of

RawEntry = tuple[bytes | None, dict[bytes, bytes] | None]
T = TypeVar("T")

# How many entries a wait for appends returns of each shard: it tells how far to move a wait's
# mark when the entries after it were delivered to another consumer.
WAIT_COUNT = 100


class RedisStreamEventSource(EventSource):
    """Reads every shard of every family with XREADGROUP as one consumer of one group.

    With a `reader` (a connection of its own), a read may block on the server until an entry
    comes (XREADGROUP BLOCK), woken by `interrupt` with CLIENT UNBLOCK from another
    connection: the read returns normally, nothing it took is lost. Without one (a Redis
    Cluster, whose slots one connection cannot read), or where the server refuses CLIENT
    UNBLOCK, a blocking read waits for appends with XREAD BLOCK instead (`WaitedReads`).
    """

    def __init__(
        self,
        redis: RedisClient,
        *,
        families: Sequence[StreamFamily],
        group: str,
        consumer: str,
        reader: PinnedReader | None = None,
    ) -> None:
        self._redis = redis
        self._reader = reader
        self._unblocker = Unblocker(redis, reader) if reader is not None else None
        self._families = tuple(families)
        self._group = group
        self._consumer = consumer
        self._family_of = {s: f for f in self._families for s in f.streams}
        self._keys = GroupKeys(group)
        self._claim_held = redis.register_script(load_lua("claim_held.lua"))
        self._look_behind = LookBehind(redis, group)
        self._trips = round_trips(redis)
        self._reader_trips = (
            HeldConnection(reader.client) if reader is not None and reader.client else None
        )
        self._waited = WaitedReads()

    @property
    def families(self) -> tuple[StreamFamily, ...]:
        return self._families

    @property
    def can_block(self) -> bool:
        """Whether reads block on the server (else they wait for appends)."""
        return self._unblocker is not None and self._unblocker.usable

    async def interrupt(self) -> None:
        if self.can_block:
            assert self._unblocker is not None
            await self._unblocker.wake()
        else:
            self._waited.interrupt()

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

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        if after and block_ms > 0 and self.can_block:
            read, refused = await self._read_blocking(after, count, acks, block_ms, look_behind)
            if read is not None:
                return read
            # A read refused (a vanished group, a shard of the wrong type): the full path
            # finds out which shard and what to do; the acks were sent already.
            read = await self._read_now(after, count, (), look_behind)
            return dataclasses.replace(read, broken={**refused, **read.broken})

        async def read_now(acks: Sequence[Delivery]) -> ReadBatch:
            return await self._read_now(after, count, acks, look_behind)

        if after and block_ms > 0:
            return await self._waited.read(after, block_ms, acks, read_now, self._wait_for_new)
        return self._waited.note(await read_now(acks))

    async def _read_blocking(
        self,
        after: Mapping[str, str],
        count: int,
        acks: Sequence[Delivery],
        block_ms: int,
        look_behind: bool,
    ) -> tuple[ReadBatch | None, dict[str, PermanentError]]:
        """On the pinned connection, in one round trip: XACK of `acks`, XREADGROUP BLOCK,
        then the look behind of `read_new`. None for the read when XREADGROUP was refused.

        A read woken by one shard's append may bring that shard's entries only (servers
        before 7.2 serve the key that woke it): the others' are new still, so the next
        blocking read returns them at once."""
        assert self._unblocker is not None
        assert self._reader is not None
        assert self._reader.client is not None
        assert self._reader_trips is not None
        with redis_errors("XREADGROUP"), self._unblocker.blocking(block_ms) as block:
            async with self._reader.client.pipeline(transaction=False) as pipe:
                acked = self._queue_acks(pipe, acks)
                # As redis-py's xreadgroup() writes it, without its checks and lag hook, once a
                # batch. BLOCK 0 would wait for ever: a read woken before it began does not block.
                pipe.execute_command(
                    "XREADGROUP",
                    *("GROUP", self._group, self._consumer, "COUNT", count),
                    *(("BLOCK", block) if block else ()),
                    "STREAMS",
                    *after,
                    *(">" for _ in after),
                )
                if look_behind:
                    self._look_behind.queue(pipe, after, together=True)
                replies = await self._reader_trips.execute(pipe)
        refused = _acks_refused(acked, replies[: len(acked)])
        read = replies[len(acked)]
        if isinstance(read, Exception):
            return None, refused
        pending = await self._look_behind.found(
            replies[len(acked) + 1 :], after, together=True, looked=look_behind
        )
        deliveries = [
            d for name, entries in _read_reply(read) for d in self._deliveries(name, entries)
        ]
        broken: dict[str, PermanentError] = dict(refused)
        gaps = self._gaps(after, pending, deliveries, broken)
        reading = {s: i for s, i in after.items() if s not in broken}
        marks = drained_marks(deliveries, reading, count)
        starts = {} if look_behind else read_starts(self._consumer, reading, deliveries)
        return ReadBatch(deliveries, frozenset(gaps), marks, broken, starts=starts), refused

    def _gaps(
        self,
        after: Mapping[str, str],
        pending: Sequence[Any],
        deliveries: Sequence[Delivery],
        broken: dict[str, PermanentError],
    ) -> set[str]:
        """The shards whose first entry pending after `after` is not the read's first one;
        a shard whose look behind was refused for good goes into `broken`."""
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
        return gaps

    async def _read_now(
        self, after: Mapping[str, str], count: int, acks: Sequence[Delivery], look_behind: bool
    ) -> ReadBatch:
        if not after:
            await self.ack(acks)
            return ReadBatch([])
        # Tagged shards live in different slots, which one XREADGROUP cannot span.
        together = len(by_slot(after)) == 1
        reads, pending, refused = await self._read_and_look_behind(
            after, count, together=together, acks=acks, look_behind=look_behind
        )
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
            again = await self._read_and_look_behind(
                vanished, count, together=together, look_behind=look_behind
            )
            redone = dict(zip(vanished, zip(*again[:2], strict=True), strict=True))
            reads = [redone[s][0] if s in redone else r for s, r in zip(after, reads, strict=True)]
            pending = [
                redone[s][1] if s in redone else p for s, p in zip(after, pending, strict=True)
            ]
        if together and isinstance(reads[0], Exception):
            error = port_error(reads[0], "XREADGROUP")
            if not isinstance(error, PermanentError):
                raise error from reads[0]
            # One XREADGROUP reads every shard or none: find the shard it failed on.
            reads, pending, _ = await self._read_and_look_behind(
                after, count, together=False, look_behind=look_behind
            )
        broken: dict[str, PermanentError] = dict(refused)
        deliveries: list[Delivery] = []
        for stream, read in zip(after, reads, strict=True):
            if isinstance(read, Exception):
                # A group destroyed again since it was created above: the next read finds
                # it gone and creates it at this consumer's position, as it did here.
                if not _is_nogroup(read):
                    broken.setdefault(stream, _refused(read, "XREADGROUP", stream))
                continue
            deliveries += [d for name, entries in read for d in self._deliveries(name, entries)]
        gaps = self._gaps(after, pending, deliveries, broken)
        reading = {s: i for s, i in after.items() if s not in broken}
        return ReadBatch(
            deliveries,
            frozenset(gaps),
            drained_marks(deliveries, reading, count),
            broken,
            regrouped,
            {} if look_behind else read_starts(self._consumer, reading, deliveries),
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
        self,
        after: Mapping[str, str],
        count: int,
        *,
        together: bool,
        acks: Sequence[Delivery] = (),
        look_behind: bool = True,
    ) -> tuple[list[Any], list[Any], dict[str, PermanentError]]:
        """XACK of `acks` first, then XREADGROUP (one for every shard `together`, else one
        per shard), then per shard the first entry pending after `after`: the read's own
        first entry, one another consumer took before it, or one an earlier read of this
        consumer took whose reply was lost (and the client retried). It is looked up after
        the read, so nothing read before it goes unseen (without `look_behind`, nothing is
        looked up: no shard has anything pending after it). Replies per shard, an exception
        where a command failed, and the streams whose XACK was refused for good."""
        with redis_errors("XREADGROUP"):
            async with self._redis.pipeline(transaction=False) as pipe:
                acked = self._queue_acks(pipe, acks)
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
                if look_behind:
                    self._look_behind.queue(pipe, after, together=together)
                replies = await self._trips.execute(pipe)
        refused = _acks_refused(acked, replies[: len(acked)])
        replies = replies[len(acked) :]
        read_replies = len(after) if not together else 1
        pending = await self._look_behind.found(
            replies[read_replies:], after, together=together, looked=look_behind
        )
        if not together:
            reads = [
                r if isinstance(r, Exception) else _read_reply(r) for r in replies[: len(after)]
            ]
            return reads, pending, refused
        if isinstance(replies[0], Exception):
            return [replies[0]] * len(after), pending, refused
        by_stream = {_text(name): entries for name, entries in _read_reply(replies[0])}
        reads = [[(s, by_stream[s])] if s in by_stream else [] for s in after]
        return reads, pending, refused

    def _queue_acks(self, pipe: Any, acks: Sequence[Delivery]) -> list[str]:
        """One XACK per stream of `acks` queued on `pipe`; the streams, in that order."""
        ids: dict[str, list[str]] = {}
        for delivery in acks:
            ids.setdefault(delivery.stream, []).append(delivery.entry_id)
        for stream, entry_ids in ids.items():
            pipe.xack(stream, self._group, *entry_ids)
        return list(ids)

    async def _wait_for_new(
        self, marks: Mapping[str, str], block_ms: int, acks: Sequence[Delivery]
    ) -> tuple[dict[str, str], dict[str, PermanentError]]:
        """Once a shard has an entry after its mark, or after `block_ms`: per shard, the last
        entry seen after its mark; `acks` first, in the same round trip where one node has
        every shard. Also the shards whose ack was refused for good."""
        slots = by_slot(marks)
        refused: dict[str, PermanentError] = {}
        if len(slots) > 1:
            # On a cluster the acks and the waits go to different nodes.
            try:
                await self.ack(acks)
            except PermanentError as error:
                refused[error.key] = error
            acks = ()
        seen: dict[str, str] = {}
        try:
            with redis_errors("XREAD"):
                if len(slots) == 1:
                    seen, refused = await self._wait(marks, block_ms, acks)
                else:
                    seen, _ = await _first_of([self._wait(part, block_ms) for part in slots])
        except PermanentError:
            # A shard refused for good: the read that follows tells which one.
            pass
        return seen, refused

    async def _wait(
        self, marks: Mapping[str, str], block_ms: int, acks: Sequence[Delivery] = ()
    ) -> tuple[dict[str, str], dict[str, PermanentError]]:
        """XREAD BLOCK after `marks`, the XACK of `acks` before it in the same round trip;
        the last entry seen after each mark, and the streams whose XACK was refused for good."""
        args: list[str | int] = ["COUNT", WAIT_COUNT, "BLOCK", block_ms, "STREAMS", *marks]
        args += marks.values()
        target = on_node_of(self._redis, next(iter(marks)))
        if not acks:
            return _last_ids(await self._redis.execute_command("XREAD", *args, **target)), {}
        async with self._redis.pipeline(transaction=False) as pipe:
            acked = self._queue_acks(pipe, acks)
            pipe.execute_command("XREAD", *args)
            replies = await pipe.execute(raise_on_error=False)
        refused = _acks_refused(acked, replies[:-1])
        if isinstance(replies[-1], Exception):
            if not refused:
                raise replies[-1]
            return {}, refused
        return _last_ids(replies[-1]), refused

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
        with redis_errors("XACK"):
            async with self._redis.pipeline(transaction=False) as pipe:
                acked = self._queue_acks(pipe, deliveries)
                replies = await pipe.execute(raise_on_error=False)
            refused = _acks_refused(acked, replies)
        if refused:
            raise next(iter(refused.values()))

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


async def _first_of(waits: list[Coroutine[Any, Any, T]]) -> T:
    """What the first of `waits` returns (or raises); the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(tasks)
    return next(iter(done)).result()


def _last_ids(reply: Any) -> dict[str, str]:
    """XREAD's reply as the id of the last entry it gave of each stream."""
    return {
        _text(name): _text(entries[-1][0])
        for name, entries in _read_reply(reply)
        if entries and entries[-1][0] is not None
    }


def _acks_refused(streams: Sequence[str], replies: Sequence[Any]) -> dict[str, PermanentError]:
    """The streams whose XACK the server refused for good; a transient refusal is raised, the
    acks are owed again."""
    refused: dict[str, PermanentError] = {}
    for stream, reply in zip(streams, replies, strict=True):
        if isinstance(reply, Exception):
            refused[stream] = _refused(reply, "XACK", stream)
    return refused


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
