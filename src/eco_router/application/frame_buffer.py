"""A stream's frames held for a reader that takes them as chunks: the writer where the HTTP
server hands the response no writer of its own, and in tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from eco_router.application.ports import FrameWriter
from eco_router.domain.sse import KEEPALIVE_FRAME, Frame


class FrameBuffer(FrameWriter):
    """Frames written wait here until `chunks` hands them on, all of them as one chunk.

    Writable only while nothing waits: a reader that falls behind holds back one chunk at
    most, and what comes meanwhile waits in the stream's own bounded queue, as it would for
    a connection whose send buffer is full.
    """

    __slots__ = ("_closed", "_drained", "_keepalive_s", "_pending", "_wake")

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._keepalive_s: float | None = None
        self._closed = False
        # Futures made only while someone waits: the reader for a write, a writer for a read.
        self._wake: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    def writable(self) -> bool:
        return not self._pending and not self._closed

    async def drained(self) -> None:
        while self._pending and not self._closed:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)

    def write(self, frame: Frame) -> None:
        self._add(frame.encoded)

    def write_all(self, frames: Sequence[Frame]) -> None:
        self._add(b"".join(frame.encoded for frame in frames))

    def keep_alive(self, every_s: float) -> None:
        self._keepalive_s = every_s
        _settle(self._wake)  # the reader's wait takes the period on

    def stop_keepalive(self) -> None:
        self._keepalive_s = None

    def _add(self, data: bytes) -> None:
        if self._closed or not data:
            return
        self._pending.append(data)
        _settle(self._wake)

    async def chunks(self, run: Callable[[FrameWriter], Awaitable[None]]) -> AsyncGenerator[bytes]:
        """Run `run(self)` and yield what it writes, a keepalive whenever nothing came for the
        keepalive period; its error, if it fails, is raised here. Closing the generator (or
        cancelling its reader) stops the run."""
        task = asyncio.ensure_future(run(self))
        task.add_done_callback(lambda _: _settle(self._wake))
        try:
            while True:
                if not self._pending:
                    if task.done():
                        break
                    self._wake = asyncio.get_running_loop().create_future()
                    try:
                        async with asyncio.timeout(self._keepalive_s):
                            await self._wake
                    except TimeoutError:
                        yield KEEPALIVE_FRAME
                        continue
                    finally:
                        self._wake = None
                    continue
                chunk = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
                self._pending.clear()
                drained, self._drained = self._drained, None
                _settle(drained)
                yield chunk
            task.result()
        finally:
            self._closed = True
            _settle(self._drained)
            if not task.done():
                task.cancel()
                await asyncio.wait([task])


def _settle(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
