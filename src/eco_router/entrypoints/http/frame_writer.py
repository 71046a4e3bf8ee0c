"""Writing SSE frames straight to a uvicorn connection, beside the ASGI response's writes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

from eco_router.application.ports import FrameWriter
from eco_router.domain.sse import KEEPALIVE_FRAME, Frame
from eco_router.entrypoints.http.keepalives import Keepalives

# The scope extension under which the server hands a request its writer.
FRAME_WRITER = "eco_router.frame_writer"


@functools.lru_cache(maxsize=1024)
def http_chunk(frame: bytes) -> bytes:
    """`frame` as one HTTP/1.1 chunk: built once per event, the same bytes for every viewer
    (a bytes object caches its hash, so the lookup costs one comparison by identity)."""
    return b"%x\r\n%s\r\n" % (len(frame), frame)


KEEPALIVE_CHUNK = b"%x\r\n%s\r\n" % (len(KEEPALIVE_FRAME), KEEPALIVE_FRAME)


class ConnectionWrites:
    """What a server's connections share for their direct writes: the batch of the loop's
    turn and the keepalive sweep."""

    __slots__ = ("batch", "keepalives")

    def __init__(self) -> None:
        self.batch = WriteBatch()
        self.keepalives = Keepalives()


class WriteBatch:
    """The connections written to during one turn of the event loop, each sent what it was
    given in one write when the turn ends.

    A connection costs a system call per write, which bounds how many frames one process
    delivers. With one event per turn that is still one write per frame, sent within the
    turn; when the process falls behind, the turn takes in every Pub/Sub message that came
    meanwhile, so each viewer gets all of them in one write: batches grow with the load.
    """

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: list[TransportFrameWriter] = []

    def add(self, writer: TransportFrameWriter) -> None:
        if not self._waiting:
            asyncio.get_running_loop().call_soon(self.flush)
        self._waiting.append(writer)

    def flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        now = asyncio.get_running_loop().time()
        for writer in waiting:
            writer.send(now)


class TransportFrameWriter(FrameWriter):
    """Writes a stream's frames as chunks of a chunked HTTP/1.1 response on the connection's
    transport, at the end of the event loop's turn (`WriteBatch`).

    The response's own writes (its head and its end) go through the server as usual; the
    stream runs between them, and the response calls `flush` before each of its own writes,
    so nothing overtakes a chunk. `writable` ensures that the response has started and not
    completed, and that the connection is open and not paused for writing.
    """

    __slots__ = (
        "_batch",
        "_cycle",
        "_flow",
        "_keepalive",
        "_keepalive_tick",
        "_keepalives",
        "_last_write",
        "_on_disconnect",
        "_pending",
        "_transport",
    )

    def __init__(self, cycle: Any, transport: Any, flow: Any, writes: ConnectionWrites) -> None:
        self._cycle = cycle
        self._transport = transport
        self._flow = flow
        self._batch = writes.batch
        self._keepalives = writes.keepalives
        self._pending: list[bytes] | None = None
        # The period once the stream asked for keepalives, and its tick in the sweep.
        self._keepalive: float | None = None
        self._keepalive_tick = 0
        self._last_write = 0.0
        self._on_disconnect: Callable[[], None] | None = None

    def writable(self) -> bool:
        cycle = self._cycle
        return bool(
            cycle.response_started
            and not cycle.response_complete
            and not cycle.disconnected
            and not self._flow.write_paused
            and not self._transport.is_closing()
        )

    async def drained(self) -> None:
        cycle = self._cycle
        while self._flow.write_paused and not cycle.disconnected:
            if self._transport.is_closing():
                return
            await self._flow.drained()

    def write(self, frame: Frame) -> None:
        self._add(http_chunk(frame.encoded))

    def write_all(self, frames: Sequence[Frame]) -> None:
        # Not through the cache: frames no other viewer gets would only push out those they do.
        data = frames[0].encoded if len(frames) == 1 else b"".join(f.encoded for f in frames)
        if data:
            self._add(b"%x\r\n%s\r\n" % (len(data), data))

    def _add(self, chunk: bytes) -> None:
        if self._pending is None:
            self._pending = [chunk]
            self._batch.add(self)
        else:
            self._pending.append(chunk)

    def on_disconnect(self, callback: Callable[[], None] | None) -> bool:
        """Call `callback` once the client disconnects (None: no more); False when it has
        already (then nothing is called)."""
        if callback is not None and self._cycle.disconnected:
            return False
        self._on_disconnect = callback
        return True

    def connection_lost(self) -> None:
        """The server's word that the connection is gone."""
        callback, self._on_disconnect = self._on_disconnect, None
        if callback is not None:
            callback()

    def flush(self) -> None:
        """Before each of the response's own writes (which count as a write too): what was
        written here before goes first."""
        self._last_write = asyncio.get_running_loop().time()
        self.send(self._last_write)

    def send(self, now: float) -> None:
        """Send what was written since the last send, unless the connection is gone; `now`
        is the loop's time."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._last_write = now
        if not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def keep_alive(self, every_s: float) -> None:
        self._keepalive = every_s
        self._last_write = asyncio.get_running_loop().time()
        self._keepalive_tick = self._keepalives.file(self, self._last_write + every_s, every_s)

    def stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive = None
            self._keepalives.discard(self, self._keepalive_tick)

    def keep_alive_at(self, now: float) -> None:
        """The sweep's look, once due: idle for the whole period, the keepalive is written
        (unless the connection cannot take it now); then filed for the next one."""
        every_s = self._keepalive
        if every_s is None:
            return
        due = self._last_write + every_s
        if now >= due:
            if self.writable():
                self._add(KEEPALIVE_CHUNK)
            due = now + every_s
        self._keepalive_tick = self._keepalives.file(self, due, every_s)
