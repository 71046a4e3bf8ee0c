"""A loopback TCP proxy whose links a test can freeze, slow down or cut, as a bad network would."""

from __future__ import annotations

import asyncio
import contextlib
from enum import StrEnum
from types import TracebackType
from typing import Self


class Mode(StrEnum):
    """What the proxy does to the bytes between its clients and the server."""

    PASS = "pass"  # forward everything at once
    FREEZE = "freeze"  # hold every byte until the mode changes; connections stay open
    SLOW = "slow"  # forward each chunk after a delay
    CUT = "cut"  # reset every connection and every new one until the mode changes


class FaultProxy:
    """Relays TCP connections to `upstream_port`; `mode` decides their fate.

    The proxy runs in the test's event loop; clients (the router processes) reach the server
    through `url` and never know it is there.
    """

    def __init__(self, upstream_port: int, *, slow_delay_s: float = 0.05) -> None:
        self._upstream_port = upstream_port
        self.slow_delay_s = slow_delay_s
        self.mode = Mode.PASS
        self.port = 0
        self.accepted = 0
        self.reset = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode is Mode.FREEZE:
            self._flowing.clear()
        else:
            self._flowing.set()
        if mode is Mode.CUT:
            for link in list(self._links):
                self.reset += 1
                link.abort()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
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
        self.accepted += 1
        try:
            if self.mode is Mode.CUT:
                self.reset += 1
                writer.transport.abort()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    "127.0.0.1", self._upstream_port
                )
            except OSError:
                writer.transport.abort()
                return
            link = _Link(writer, up_writer)
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
        finally:
            self._handlers.discard(task)

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
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()

    def abort(self) -> None:
        """Reset both connections at once (RST), as a dropped network path looks to a client."""
        for writer in self._writers:
            writer.transport.abort()
