"""A small in-process model of Redis Streams with consumer groups."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from eco_router.adapters.memory.leases import LeaseTable
from eco_router.application.ports import Clock
from eco_router.domain.event import StreamEntryId

Fields = dict[bytes, bytes]


@dataclass(slots=True)
class PendingEntry:
    """One entry of a group's pending list: owner, last delivery time and delivery count."""

    consumer: str
    delivered_ms: int
    count: int


@dataclass(slots=True)
class Group:
    """A consumer group: last delivered id and pending entries."""

    last_delivered: StreamEntryId
    pending: dict[str, PendingEntry] = field(default_factory=dict)


@dataclass(slots=True)
class Stream:
    """Entries in id order and the groups reading them."""

    entries: dict[str, Fields] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    last_id: StreamEntryId = field(default_factory=lambda: StreamEntryId(0, 0))
    # The highest id ever deleted (Redis: XINFO STREAM's max-deleted-entry-id).
    max_deleted: StreamEntryId = field(default_factory=lambda: StreamEntryId(0, 0))


class NoGroup(Exception):
    """The stream or the group does not exist (Redis: NOGROUP)."""


class WrongType(Exception):
    """The key holds another type than a stream (Redis: WRONGTYPE)."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"WRONGTYPE Operation against a key holding the wrong kind of value ({key})"
        )
        self.key = key


class InMemoryStreams:
    """Streams, groups and pending lists with Redis's semantics, shared by sources and producers."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._streams: dict[str, Stream] = {}
        self._appended = asyncio.Event()
        self._lease_tables: dict[str, LeaseTable] = {}
        self._not_streams: set[str] = set()

    def lease_table(self, group: str) -> LeaseTable:
        """The leases and fencing epochs of `group`, kept beside its streams."""
        return self._lease_tables.setdefault(group, LeaseTable(self._clock))

    def break_shard(self, stream: str) -> None:
        """Replace the stream by a key of another type, as `DEL` then `SET key x` would: every
        stream command on it fails with `WrongType` until `delete_stream`."""
        self._streams.pop(stream, None)
        self._not_streams.add(stream)

    def xadd(self, stream: str, fields: Mapping[bytes, bytes] | Mapping[str, str]) -> str:
        """Append an entry with a fresh id; returns the id."""
        self._check_type(stream)
        target = self._streams.setdefault(stream, Stream())
        now = self._clock.now_ms()
        last = target.last_id
        new_id = (
            StreamEntryId(now, 0) if now > last.ms else StreamEntryId(last.ms, last.sequence + 1)
        )
        target.last_id = new_id
        target.entries[str(new_id)] = {_b(k): _b(v) for k, v in fields.items()}
        self._appended.set()
        return str(new_id)

    def entries(self, stream: str) -> list[tuple[str, Fields]]:
        return list(self._streams.get(stream, Stream()).entries.items())

    def never_held(self, stream: str, entry_id: str) -> bool:
        """Whether `stream` exists and never held `entry_id`: not there, no deletion went as
        far, and not before its first entry (trimmed)."""
        target = self._streams.get(stream)
        if target is None or not target.entries or entry_id in target.entries:
            return False
        first = next(iter(target.entries))
        return _after(entry_id, target.max_deleted) and _after(entry_id, StreamEntryId.parse(first))

    def delete_entry(self, stream: str, entry_id: str) -> None:
        target = self._streams.get(stream, Stream())
        if target.entries.pop(entry_id, None) is not None:
            target.max_deleted = max(target.max_deleted, StreamEntryId.parse(entry_id))

    def delete_stream(self, stream: str) -> None:
        self._streams.pop(stream, None)
        self._not_streams.discard(stream)

    def destroy_group(self, stream: str, group: str) -> None:
        """XGROUP DESTROY: the group and its pending list go, the entries stay."""
        self._streams.get(stream, Stream()).groups.pop(group, None)

    def create_group(self, stream: str, group: str, at: str = "0-0") -> bool:
        """Create the group at id `at` (MKSTREAM); False when it already exists."""
        self._check_type(stream)
        target = self._streams.setdefault(stream, Stream())
        if group in target.groups:
            return False
        target.groups[group] = Group(StreamEntryId.parse(at))
        return True

    def pending(self, stream: str, group: str) -> dict[str, PendingEntry]:
        return dict(self._group(stream, group).pending)

    def gap_before(
        self, stream: str, group: str, *, after: str, first: str | None, consumer: str
    ) -> bool:
        """Whether the first entry pending after `after` (XPENDING stream group (after + 1)
        is not `first`, the first entry `consumer`'s read after `after` brought."""
        floor = StreamEntryId.parse(after)
        pending = self._group(stream, group).pending
        later = [i for i in pending if StreamEntryId.parse(i) > floor]
        if not later:
            return False
        lowest = min(later, key=StreamEntryId.parse)
        return (lowest, pending[lowest].consumer) != (first, consumer)

    def last_delivered(self, stream: str, group: str) -> str:
        return str(self._group(stream, group).last_delivered)

    def lag(self, stream: str, group: str) -> int:
        last = self._group(stream, group).last_delivered
        return sum(1 for i in self._streams[stream].entries if _after(i, last))

    def read_new(
        self, group: str, consumer: str, streams: list[str], count: int
    ) -> dict[str, list[tuple[str, Fields]]]:
        out: dict[str, list[tuple[str, Fields]]] = {}
        now = self._clock.now_ms()
        for name in streams:
            self._check_type(name)
        for name in streams:
            state = self._group(name, group)
            taken = [
                (i, f)
                for i, f in self._streams[name].entries.items()
                if _after(i, state.last_delivered)
            ][:count]
            for entry_id, _ in taken:
                state.pending[entry_id] = PendingEntry(consumer, now, 1)
            if taken:
                state.last_delivered = StreamEntryId.parse(taken[-1][0])
                out[name] = taken
        return out

    def last_id(self, stream: str) -> str:
        """The id of the stream's last entry, `0-0` when it has none."""
        entries = self._streams.get(stream, Stream()).entries
        return next(reversed(entries), "0-0")

    async def wait_for_entries(self, marks: Mapping[str, str], timeout_s: float) -> None:
        """Until a stream has an entry after its mark, or `timeout_s` passed."""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    self._appended.clear()
                    if any(
                        _after(self.last_id(stream), StreamEntryId.parse(mark))
                        for stream, mark in marks.items()
                    ):
                        return
                    await self._appended.wait()
        except TimeoutError:
            return

    async def wait_for_undelivered(
        self, group: str, streams: Collection[str], timeout_s: float
    ) -> None:
        """Until a stream has an entry the group has not delivered yet (what XREADGROUP BLOCK
        waits for), or its group or key changed (the read that follows tells), or
        `timeout_s` passed."""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    self._appended.clear()
                    try:
                        if any(self.lag(stream, group) > 0 for stream in streams):
                            return
                    except (NoGroup, WrongType, KeyError):
                        return
                    await self._appended.wait()
        except TimeoutError:
            return

    def autoclaim(
        self, stream: str, group: str, consumer: str, min_idle_ms: int, cursor: str, count: int
    ) -> tuple[str, list[tuple[str, Fields, int]], list[str]]:
        state = self._group(stream, group)
        now = self._clock.now_ms()
        start = StreamEntryId.parse(cursor)
        candidates = sorted(
            (i for i in state.pending if StreamEntryId.parse(i) >= start), key=StreamEntryId.parse
        )
        claimed: list[tuple[str, Fields, int]] = []
        deleted: list[str] = []
        scanned = 0
        next_cursor = "0-0"
        for entry_id in candidates:
            if scanned == count:
                next_cursor = entry_id
                break
            scanned += 1
            entry = state.pending[entry_id]
            if now - entry.delivered_ms < min_idle_ms:
                continue
            fields = self._streams[stream].entries.get(entry_id)
            if fields is None:
                del state.pending[entry_id]
                deleted.append(entry_id)
                continue
            entry.consumer, entry.delivered_ms, entry.count = consumer, now, entry.count + 1
            claimed.append((entry_id, fields, entry.count))
        return next_cursor, claimed, deleted

    def ack(self, stream: str, group: str, entry_ids: list[str]) -> int:
        state = self._group(stream, group)
        return sum(1 for i in entry_ids if state.pending.pop(i, None) is not None)

    def _check_type(self, stream: str) -> None:
        if stream in self._not_streams:
            raise WrongType(stream)

    def _group(self, stream: str, group: str) -> Group:
        self._check_type(stream)
        target = self._streams.get(stream)
        if target is None or group not in target.groups:
            raise NoGroup(f"NOGROUP no group {group!r} on stream {stream!r}")
        return target.groups[group]


def _after(entry_id: str, floor: StreamEntryId) -> bool:
    return StreamEntryId.parse(entry_id) > floor


def _b(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
