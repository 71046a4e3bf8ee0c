"""From a stream of deltas to batches of token entries, shared by every publisher.

Deltas are merged by `Coalescing` (by when each arrived); entries that are ready together
come out as one batch, which a publisher writes in one round trip.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from eco_router.adapters.progress_entries import delta_cost, delta_text
from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.progress import InvalidProgressEvent
from eco_router.domain.token_entries import Coalescing, PendingText, TokensPublished

# Entries in one round trip at most: a long list of deltas goes in a few pipelines, not one
# that holds the server for its whole length.
MAX_BATCH = 256
# Deltas read ahead of the writes: a source faster than Redis waits here, not in memory.
_READ_AHEAD = 1024

Clock = Callable[[], float]
TokenSource = AsyncIterable[Any] | Iterable[Any]


class _End:
    """The source is exhausted."""


@dataclass(frozen=True, slots=True)
class _Failed:
    """The source raised: what came before is still written, then this is raised."""

    error: BaseException


_END = _End()


def refuse_text(tokens: object) -> None:
    """A `str` is an iterable of characters: passing one is a mistake, not a stream."""
    if isinstance(tokens, (str, bytes, bytearray)):
        raise InvalidProgressEvent(
            "tokens must be an iterable of deltas, not one text: use publish_token for one"
        )


class TokenBatching:
    """The deltas of one run turned into batches of entry texts, without I/O: a shell feeds
    what its source gave and when (`arrived`, `ended`, `failed`, `tick`) and writes what
    `batches` hands, whatever it reads with (a thread, an event loop).

    - Deltas merge as `Coalescing` rules; an empty delta (a chunk without text) is skipped.
    - A batch holds at most `MAX_BATCH` entries.
    - The source's end, its failure, or an item that is not a delta close the pending
      entry: what came before is written, then the failure is raised (`raise_failure`), and
      nothing the source gives after it is taken.
    """

    def __init__(self, rule: Coalescing) -> None:
        self._rule = rule
        self._pending: PendingText | None = None
        self._ready: list[str] = []
        self._failure: BaseException | None = None
        self.over = False

    def arrived(self, item: object, now: float) -> None:
        """The source gave `item` at `now`."""
        if self.over:
            return
        try:
            text = delta_text(item)
        except InvalidProgressEvent as error:
            self.failed(error)
            return
        if not text:  # an empty delta would cost an entry and change nothing
            return
        self._pending, closed = self._rule.add(self._pending, text, cost=delta_cost(text), now=now)
        if closed is not None:
            self._ready.append(closed)

    def ended(self) -> None:
        """The source is exhausted."""
        self._close()

    def failed(self, error: BaseException) -> None:
        """The source raised `error` (or gave what is not a delta)."""
        if not self.over:
            self._failure = error
            self._close()

    def due_in(self, now: float) -> float | None:
        """How long until the pending entry is due (None: no entry is pending)."""
        if self._pending is None:
            return None
        return max(self._rule.due_at(self._pending) - now, 0.0)

    def tick(self, now: float) -> None:
        """Close the pending entry if its window is over at `now`."""
        if self._pending is not None and now >= self._rule.due_at(self._pending):
            self._ready.append(self._pending.text)
            self._pending = None

    def batches(self) -> list[list[str]]:
        """The closed entries not handed yet, in batches of at most `MAX_BATCH`."""
        ready, self._ready = self._ready, []
        return [ready[start : start + MAX_BATCH] for start in range(0, len(ready), MAX_BATCH)]

    def full_batches(self) -> list[list[str]]:
        """`batches`, only once a whole batch is closed (a source that is all there: fewer
        round trips)."""
        return self.batches() if len(self._ready) >= MAX_BATCH else []

    def raise_failure(self) -> None:
        """Raise what stopped the source, if anything did."""
        if self._failure is not None:
            raise self._failure

    def _close(self) -> None:
        if self._pending is not None:
            self._ready.append(self._pending.text)
            self._pending = None
        self.over = True


async def coalesced(
    tokens: TokenSource, rule: Coalescing, *, clock: Clock = time.monotonic
) -> AsyncGenerator[list[str], None]:
    """The texts of the entries `tokens` make, in batches of those ready together
    (`TokenBatching`'s rules).

    A separate task reads the source, so a pending entry is written when its window ends
    even while the source is quiet, and deltas keep coming while a batch is written. Close
    the generator (`contextlib.aclosing`): that stops the reading task.
    """
    queue: asyncio.Queue[tuple[float, object]] = asyncio.Queue(_READ_AHEAD)
    reader = asyncio.create_task(_read(tokens, queue, clock), name="token source")
    batching = TokenBatching(rule)
    try:
        while not batching.over:
            try:
                async with asyncio.timeout(batching.due_in(clock())):
                    arrived = [await queue.get()]
            except TimeoutError:
                arrived = []
            while not queue.empty():
                arrived.append(queue.get_nowait())
            for at, item in arrived:
                if isinstance(item, _End):
                    batching.ended()
                elif isinstance(item, _Failed):
                    batching.failed(item.error)
                else:
                    batching.arrived(item, at)
            batching.tick(clock())
            for batch in batching.batches():
                yield batch
        batching.raise_failure()
    finally:
        await cancel_and_wait([reader])


def coalesced_sync(
    tokens: Iterable[Any], rule: Coalescing, *, clock: Clock = time.monotonic
) -> Iterator[list[str]]:
    """`coalesced` for a synchronous source, read in the caller's thread.

    A list or tuple is all there: its entries go in batches of `MAX_BATCH`. Any other
    iterator may block between deltas, so each entry is written as soon as it is closed:
    when a delta comes after its window (or would not fit), or at the end.
    """
    whole = isinstance(tokens, Sequence)
    batching = TokenBatching(rule)
    iterator = iter(tokens)
    while not batching.over:
        try:
            item = next(iterator)
        except StopIteration:
            batching.ended()
            break
        except Exception as error:  # written up to here, then raised
            batching.failed(error)
            break
        batching.arrived(item, clock())
        yield from batching.full_batches() if whole else batching.batches()
    yield from batching.batches()
    batching.raise_failure()


@dataclass(slots=True)
class TokenTally:
    """What a run has written so far."""

    first_seq: int
    entries: int = 0
    characters: int = 0
    text_bytes: int = 0

    def add(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.entries += 1
            self.characters += len(text)
            self.text_bytes += len(text.encode())

    def published(self) -> TokensPublished:
        last = self.first_seq + self.entries - 1 if self.entries else None
        return TokensPublished(self.entries, self.first_seq, last, self.characters, self.text_bytes)


async def _read(
    tokens: TokenSource, queue: asyncio.Queue[tuple[float, object]], clock: Clock
) -> None:
    try:
        if isinstance(tokens, AsyncIterable):
            async for item in tokens:
                await queue.put((clock(), item))
        else:
            for item in tokens:
                await queue.put((clock(), item))
    except Exception as error:
        await queue.put((clock(), _Failed(error)))
        return
    await queue.put((clock(), _END))
