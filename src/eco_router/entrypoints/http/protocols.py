"""The gateway's HTTP/1.1 protocols: uvicorn's, plus a deadline for each request's headers,
a hard connection limit, and the frame writer handed to each GET (`EVENT_ROUTER_HTTP_PARSER`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eco_router.entrypoints.http.frame_writer import (
    FRAME_WRITER,
    ConnectionWrites,
    TransportFrameWriter,
)

log = logging.getLogger(__name__)

HttpParserChoice = Literal["httptools", "h11"]


class HeaderDeadline:
    """uvicorn only times out a connection that is idle between requests (keep-alive); a
    client that connects and sends nothing, or part of a request's headers, would hold its
    connection forever. The deadline starts when the connection opens or a new request's
    first byte arrives, and ends once the headers are complete; past it `late` is called."""

    __slots__ = ("_late", "_loop", "_timeout_s", "_timer")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout_s: float, late: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._late = late
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = self._loop.call_later(self._timeout_s, self._expired)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        self._late()


def _dropped(connections: set[Any], drop_above: int | None, transport: asyncio.Transport) -> bool:
    """A connection opened past `drop_above` is closed at once, unanswered."""
    if drop_above is not None and len(connections) > drop_above:
        log.debug("dropping a connection: %d open", len(connections))
        transport.abort()
        return True
    return False


def _offer_frame_writer(
    cycle: Any, transport: asyncio.Transport, flow: Any, writes: ConnectionWrites
) -> TransportFrameWriter | None:
    """A new request's task is created, not yet run: its scope can still take an extension.
    Only a chunked response (a GET over HTTP/1.1) can take raw chunks."""
    scope = cycle.scope
    if scope["method"] != "GET" or scope["http_version"] != "1.1":
        return None
    writer = TransportFrameWriter(cycle, transport, flow, writes)
    extensions: dict[str, object] = scope.setdefault("extensions", {})
    extensions[FRAME_WRITER] = writer
    return writer


def _connection_writes(config: uvicorn.Config) -> ConnectionWrites:
    """The server's (`GatewayConfig`), or the connection's own."""
    writes = getattr(config, "connection_writes", None)
    return writes if isinstance(writes, ConnectionWrites) else ConnectionWrites()


def _close_late(transport: asyncio.Transport) -> None:
    if not transport.is_closing():
        log.debug("closing a connection whose request headers did not arrive in time")
        transport.close()


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with the gateway's additions (pure Python)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        timeout_s = float(getattr(config, "header_timeout_s", 10.0))
        self._deadline = HeaderDeadline(self.loop, timeout_s, self._headers_late)
        self._drop_above: int | None = getattr(config, "drop_above", None)
        self._writes = _connection_writes(config)
        self._frame_writer: TransportFrameWriter | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not _dropped(self.connections, self._drop_above, transport):
            self._deadline.arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._deadline.arm()
        cycle = self.cycle
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._deadline.disarm()
        if self.cycle is not cycle and self.cycle is not None:
            self._frame_writer = _offer_frame_writer(
                self.cycle, self.transport, self.flow, self._writes
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.disarm()
        super().connection_lost(exc)
        if self._frame_writer is not None:
            self._frame_writer.connection_lost()

    def _headers_late(self) -> None:
        if self.conn.their_state is h11.IDLE:
            _close_late(self.transport)


class HttpToolsHeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (a C parser) with the gateway's additions."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        timeout_s = float(getattr(config, "header_timeout_s", 10.0))
        self._deadline = HeaderDeadline(self.loop, timeout_s, self._headers_late)
        self._drop_above: int | None = getattr(config, "drop_above", None)
        self._writes = _connection_writes(config)
        self._frame_writer: TransportFrameWriter | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not _dropped(self.connections, self._drop_above, transport):
            self._deadline.arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._deadline.arm()

    def on_headers_complete(self) -> None:
        self._deadline.disarm()
        cycle = self.cycle
        super().on_headers_complete()
        if self.cycle is not cycle and self.cycle is not None:
            self._frame_writer = _offer_frame_writer(
                self.cycle, self.transport, self.flow, self._writes
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.disarm()
        super().connection_lost(exc)
        if self._frame_writer is not None:
            self._frame_writer.connection_lost()

    def _headers_late(self) -> None:
        _close_late(self.transport)


def http_protocol(choice: HttpParserChoice) -> type[asyncio.Protocol]:
    """httptools' C parser costs a connection less than h11's pure Python; h11 is stricter
    about what it accepts and has no compiled part."""
    return HttpToolsHeaderTimeoutProtocol if choice == "httptools" else HeaderTimeoutProtocol
