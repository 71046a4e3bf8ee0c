"""Reading a stream of deltas, in a thread or on an event loop, into the batches of token
entries `TokenBatching` makes of it; shared by every publisher, which writes each batch in
one round trip.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from eco_router.adapters.producer_core import MAX_BATCH, TokenBatching, TokenTally, refuse_text
from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.token_entries import Coalescing

__all__ = [
    "MAX_BATCH",
    "TokenBatching",
    "TokenSource",
    "TokenTally",
    "coalesced",
    "coalesced_sync",
    "refuse_text",
]

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
