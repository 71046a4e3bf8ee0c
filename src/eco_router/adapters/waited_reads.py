"""Blocking reads for a source whose reads cannot wait on the server: wait for appends, read."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence

from eco_router.application.errors import PermanentError
from eco_router.application.port_values import Delivery, ReadBatch
from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.event import StreamEntryId

# Acks, then a read of every shard being read, without blocking.
ReadNow = Callable[[Sequence[Delivery]], Awaitable[ReadBatch]]
# Acks, then a wait for an entry after each mark: per shard the last entry seen after its
# mark, and the shards whose ack was refused for good.
WaitForAppends = Callable[
    [Mapping[str, str], int, Sequence[Delivery]],
    Awaitable[tuple[dict[str, str], dict[str, PermanentError]]],
]


class WaitedReads:
    """The blocking `read_new` of a source that cannot block on the server (a Redis Cluster,
    a server refusing CLIENT UNBLOCK, the in-memory source made so).

    - After a read that drained the same shards, the next one waits for an entry appended
      after that read's marks first (the acks go with the wait), then reads; otherwise it
      reads first and waits only if that read drained them.
    - A mark moves past the entries an earlier wait saw there that no read then brought
      (another consumer has them: a router that took the shard over while this one was
      paused, before it notices): waiting after them again would return at once.
    - `interrupt` ends the wait (it reads nothing into the group, so nothing is lost); with
      no wait in flight, the next read does not wait.
    """

    def __init__(self) -> None:
        self._marks: dict[str, str] = {}
        self._seen: dict[str, str] = {}
        self._waking: asyncio.Event | None = None
        self._woken = False

    def interrupt(self) -> None:
        if self._waking is not None:
            self._waking.set()
        else:
            self._woken = True

    def note(self, read: ReadBatch) -> ReadBatch:
        """`read` (any read of this source) is the last one: a wait goes after its marks."""
        self._marks = dict(read.marks)
        return read

    async def read(
        self,
        after: Mapping[str, str],
        block_ms: int,
        acks: Sequence[Delivery],
        read_now: ReadNow,
        wait_for_appends: WaitForAppends,
    ) -> ReadBatch:
        woken, self._woken = self._woken, False
        self._seen = {s: i for s, i in self._seen.items() if s in after}
        marks: Mapping[str, str] = self._marks if self._marks.keys() == after.keys() else {}
        if woken or not marks:
            read = self.note(await read_now(acks))
            if woken or read.deliveries or read.gaps or read.broken or not read.marks:
                return read
            marks, acks = read.marks, ()
        waking = self._waking = asyncio.Event()
        appended = asyncio.ensure_future(
            wait_for_appends(past_seen(marks, self._seen), block_ms, acks)
        )
        woke = asyncio.ensure_future(waking.wait())
        try:
            await asyncio.wait([appended, woke], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waking = None
            await cancel_and_wait([appended, woke])
        seen: dict[str, str] = {}
        refused: dict[str, PermanentError] = {}
        if appended.cancelled():
            acks_again = acks  # woken: they may not have gone; acking twice is harmless
        else:
            seen, refused = appended.result()
            acks_again = ()
        for stream, entry_id in seen.items():
            self._seen[stream] = later(self._seen.get(stream), entry_id)
        read = self.note(await read_now(acks_again))
        return dataclasses.replace(read, broken={**refused, **read.broken})


def past_seen(marks: Mapping[str, str], seen: Mapping[str, str]) -> dict[str, str]:
    """`marks`, each moved past the entry an earlier wait saw after it, if later."""
    return {s: later(seen.get(s), mark) for s, mark in marks.items()}


def later(first: str | None, second: str) -> str:
    """The later of two entry ids (`first` may be missing)."""
    if first is None or StreamEntryId.parse(second) > StreamEntryId.parse(first):
        return second
    return first
