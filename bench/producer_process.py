"""A producer run in a spawned process of its own, which hands its figures back when done."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Callable
from typing import Any, Self

JOIN_TIMEOUT_S = 10.0


class ProducerProcess:
    """`target(*args, **kwargs)` in a spawned child; what it returns comes back by a pipe.

    A coroutine the target returns is run to its end in the child. A context manager: leaving
    the block waits a little for the child to exit, then kills it.
    """

    def __init__(self, target: Callable[..., object], *args: Any, name: str, **kwargs: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._reply, child_end = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_report, args=(target, args, kwargs, child_end), name=name
        )

    def __enter__(self) -> Self:
        self._process.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._process.join(JOIN_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def figures(self, within_s: float, *, meanwhile: Callable[[], object]) -> Any:
        """What the target returned, `meanwhile` running (and pacing) the wait for it."""
        give_up = time.monotonic() + within_s
        while not self._reply.poll(0):
            self._raise_if_lost(give_up)
            meanwhile()
        return self._reply.recv()

    async def figures_async(self, within_s: float, *, poll_s: float) -> Any:
        """What the target returned, waited for without blocking the event loop."""
        give_up = time.monotonic() + within_s
        while not self._reply.poll(0):
            self._raise_if_lost(give_up)
            await asyncio.sleep(poll_s)
        return self._reply.recv()

    def _raise_if_lost(self, give_up: float) -> None:
        if time.monotonic() > give_up or not self._process.is_alive():
            raise RuntimeError("the producer process did not report")


def _report(
    target: Callable[..., object],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    reply: multiprocessing.connection.Connection,
) -> None:
    result = target(*args, **kwargs)
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    reply.send(result)
