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


async def coalesced(
    tokens: TokenSource, rule: Coalescing, *, clock: Clock = time.monotonic
) -> AsyncGenerator[list[str], None]:
    """The texts of the entries `tokens` make, in batches of those ready together.

    A separate task reads the source, so a pending entry is written when its window ends
    even while the source is quiet, and deltas keep coming while a batch is written. What
    arrived before the source fails (or yields something that is not a delta) is written,
    then its error is raised. Close the generator (`contextlib.aclosing`): that stops the
    reading task.
    """
    queue: asyncio.Queue[tuple[float, object]] = asyncio.Queue(_READ_AHEAD)
    reader = asyncio.create_task(_read(tokens, queue, clock), name="token source")
    pending: PendingText | None = None
    try:
        while True:
            timeout = None if pending is None else max(rule.due_at(pending) - clock(), 0.0)
            try:
                async with asyncio.timeout(timeout):
                    first = await queue.get()
            except TimeoutError:
                assert pending is not None  # only a pending entry sets a timeout
                yield [pending.text]
                pending = None
                continue
            arrived = [first]
            while not queue.empty():
                arrived.append(queue.get_nowait())
            ready: list[str] = []
            pending, ended, failure = _merge(arrived, pending, rule, ready)
            if pending is not None and (ended or failure or clock() >= rule.due_at(pending)):
                ready.append(pending.text)
                pending = None
            for start in range(0, len(ready), MAX_BATCH):
                yield ready[start : start + MAX_BATCH]
            if failure is not None:
                raise failure
            if ended:
                return
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
    ready: list[str] = []
    pending: PendingText | None = None
    failure: BaseException | None = None
    iterator = iter(tokens)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            break
        except Exception as error:  # written up to here, then raised
            failure = error
            break
        pending, _, failure = _merge([(clock(), item)], pending, rule, ready)
        if failure is not None:
            break
        if ready and (not whole or len(ready) >= MAX_BATCH):
            yield ready
            ready = []
    if pending is not None:
        ready.append(pending.text)
    for start in range(0, len(ready), MAX_BATCH):
        yield ready[start : start + MAX_BATCH]
    if failure is not None:
        raise failure


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


def _merge(
    arrived: Iterable[tuple[float, object]],
    pending: PendingText | None,
    rule: Coalescing,
    ready: list[str],
) -> tuple[PendingText | None, bool, BaseException | None]:
    """Feed arrived items to `rule`, appending closed entries to `ready`; returns the pending
    entry, whether the source ended and the error that stops it, if any."""
    for arrived_at, item in arrived:
        if isinstance(item, _End):
            return pending, True, None
        if isinstance(item, _Failed):
            return pending, False, item.error
        try:
            text = delta_text(item)
        except InvalidProgressEvent as error:
            return pending, False, error
        if not text:  # an empty delta would cost an entry and change nothing
            continue
        pending, closed = rule.add(pending, text, cost=delta_cost(text), now=arrived_at)
        if closed is not None:
            ready.append(closed)
    return pending, False, None


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
