"""A loopback TCP relay to a Redis server that a test can slow, freeze, hold or cut.

Clients (router processes, gateways) dial the relay's `url` and never know it is there, so a
test can make their network misbehave while it reaches the server directly itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from enum import StrEnum
from typing import Self


class Mode(StrEnum):
    """What the relay does to its connections, established and new alike unless said otherwise."""

    PASS = "pass"  # forward everything at once
    SLOW = "slow"  # forward each chunk after a delay
    FREEZE = "freeze"  # hold every byte until the mode changes; connections stay open
    HOLD = "hold"  # new connections wait, unanswered, until the mode changes; the rest flow
    HANG_UP = "hang-up"  # close new connections at once; the rest flow
    CUT = "cut"  # reset every connection and every new one until the mode changes


class TcpRelay:
    """Relays TCP connections to `upstream_port`; `mode` decides their fate.

    It runs in the test's event loop. `reset` counts the connections a cut reset. When the server
    cannot be reached the relay hangs up on the client, as a server that is down would.
    """

    def __init__(self, upstream_port: int, *, slow_delay_s: float = 0.05) -> None:
        self._upstream_port = upstream_port
        self.slow_delay_s = slow_delay_s
        self.mode = Mode.PASS
        self.port = 0
        self.reset = 0
        self._flowing = asyncio.Event()
        self._admitting = asyncio.Event()
        self._flowing.set()
        self._admitting.set()
        self._closing = False
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        _set(self._flowing, mode is not Mode.FREEZE)
        _set(self._admitting, mode is not Mode.HOLD)
        if mode is Mode.CUT:
            for link in list(self._links):
                self.reset += 1
                link.abort()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Every handler ends on its own once its sockets are gone: none is cancelled mid-write.
        self._closing = True
        if self._server is not None:
            self._server.close()
        self._admitting.set()
        self._flowing.set()
        for link in list(self._links):
            link.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._admitting.wait()
            await self._relay(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode is Mode.CUT:
            self.reset += 1
            writer.transport.abort()
            return
        if self._closing or self.mode is Mode.HANG_UP:
            _close(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        except OSError:
            _close(writer)
            return
        link = _Link(writer, up_writer)
        if self._closing:
            link.abort()
            return
        self._links.add(link)
        try:
            pumps = [
                asyncio.create_task(self._pump(reader, up_writer)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            # Either side ending ends the link, as one TCP connection would.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            link.close()
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._links.discard(link)
            link.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            while data := await source.read(65536):
                # Frozen: bytes already read wait here; the kernel buffers hold the rest.
                await self._flowing.wait()
                if self.mode is Mode.CUT or sink.is_closing():
                    return
                if self.mode is Mode.SLOW:
                    await asyncio.sleep(self.slow_delay_s)
                sink.write(data)
                await sink.drain()


class _Link:
    """Both ends of one relayed connection."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self._writers = (client, upstream)

    def close(self) -> None:
        for writer in self._writers:
            _close(writer)

    def abort(self) -> None:
        """Reset both connections at once (RST), as a dropped network path looks to a client."""
        for writer in self._writers:
            writer.transport.abort()


def _set(event: asyncio.Event, on: bool) -> None:
    if on:
        event.set()
    else:
        event.clear()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        writer.close()
