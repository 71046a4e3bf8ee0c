"""The gateway's HTTP/1.1 protocols: uvicorn's, plus deadlines for each request's head and
body, limits on what a request sends, connection caps (in all and per client address), and
the frame writer handed to each GET (`EVENT_ROUTER_HTTP_PARSER`)."""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Callable
from typing import Any

import h11
import uvicorn
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eco_router.entrypoints.http.frame_writer import (
    FRAME_WRITER,
    ConnectionWrites,
    TransportFrameWriter,
)
from eco_router.entrypoints.http.parser_choice import HttpParserChoice
from eco_router.entrypoints.http.request_bounds import (
    ClientConnections,
    HeadMeter,
    declared_body_bytes,
    refusal,
)
from eco_router.entrypoints.http.request_limits import RequestLimits

log = logging.getLogger(__name__)


class Deadline:
    """One timer a connection arms and disarms again and again: `arm` starts it unless it
    runs already; past it `late` is called."""

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


async def _body_too_large(
    scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
) -> None:
    """The app of a request whose declared body is past the limit: 413, and the connection
    closes once it is written."""
    phrase = http.HTTPStatus(413).phrase.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(phrase)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": phrase, "more_body": False})


class GatewayProtocol(asyncio.Protocol):
    """What the gateway adds to either uvicorn protocol, in one place. Each parser's class
    says when it reads a request's head or body (`_reading_head`, `_reading_body`) and calls
    `_head_begun` / `_head_complete` where its parser sees them.

    - A head must be complete within the header timeout of the connection's opening or of
      its first byte; a body within the body timeout of its head (408 if no response has
      begun, else the connection is closed at once).
    - A head's bytes, lines and request line are metered before the parser gets them (414,
      431); a body declared past the limit is answered 413 instead of running the app, one
      sent past it (chunked) gets 413 where no response has begun, else the connection is
      closed at once.
    - Past the connections the server drops at once, or past its address's cap, a new
      connection is closed at once, unanswered.
    """

    # Set by uvicorn's protocols.
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None
    connections: set[Any]
    server_state: Any
    cycle: Any
    scope: Any
    flow: Any

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        limits = getattr(config, "request_limits", None) or RequestLimits()
        self._limits: RequestLimits = limits
        self._clients: ClientConnections = getattr(config, "client_connections", None) or (
            ClientConnections(0)
        )
        self._drop_above: int | None = getattr(config, "drop_above", None)
        self._writes = _connection_writes(config)
        self._frame_writer: TransportFrameWriter | None = None
        timeout_s = float(getattr(config, "header_timeout_s", 10.0))
        self._head_deadline = Deadline(self.loop, timeout_s, self._head_late)
        self._body_deadline = Deadline(self.loop, limits.body_timeout_s, self._body_late)
        self._meter = HeadMeter(limits)
        self._heads = 0  # heads completed on this connection
        self._body_bytes = 0  # of the latest request's body, as the parser gave them
        self._host: str | None = None

    # uvicorn takes each request's app from here, once the request's head is parsed.
    @property
    def app(self) -> ASGI3Application:
        if declared_body_bytes(self.scope["headers"]) > self._limits.max_body_bytes:
            return _body_too_large
        return self._app

    @app.setter
    def app(self, app: ASGI3Application) -> None:
        self._app = app

    def _reading_head(self) -> bool:
        raise NotImplementedError

    def _reading_body(self) -> bool:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if _dropped(self.connections, self._drop_above, transport):
            return
        host = self.client[0] if self.client else None
        if host is not None:
            if not self._clients.admit(host):
                log.debug("dropping a connection: %s holds too many", host)
                transport.abort()
                return
            self._host = host
        self._head_begun()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        held = len(cycle.body) if cycle is not None else 0
        # Metered while the parser reads a head: it gets no more than the limits allow, and
        # what follows a head that ends inside `data` goes on to the parser.
        while data and self._reading_head() and not self.transport.is_closing():
            heads = self._heads
            taken = self._meter.take(data)
            if taken:
                super().data_received(data if taken == len(data) else data[:taken])
            data = data[taken:]
            if not self._reading_head():
                self._head_complete()
            elif data and self._heads == heads:
                self._refuse(self._meter.refusal(), answer=self._answerable_head())
                return
        if data and not self.transport.is_closing():
            super().data_received(data)
            if not self._reading_head():
                self._head_complete()
        if not self.transport.is_closing():
            self._check_body(cycle, held)

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_deadline.disarm()
        self._body_deadline.disarm()
        if self._host is not None:
            self._clients.release(self._host)
            self._host = None
        super().connection_lost(exc)
        if self._frame_writer is not None:
            self._frame_writer.connection_lost()

    def _head_begun(self) -> None:
        self._head_deadline.arm()

    def _head_complete(self) -> None:
        self._head_deadline.disarm()
        self._meter.reset()
        self._heads += 1

    def _check_body(self, cycle_before: Any, held_before: int) -> None:
        """After the parser had this turn's bytes: the body's size and deadline."""
        if not self._reading_body():
            self._body_deadline.disarm()
            return
        cycle = self.cycle
        if cycle is not cycle_before:
            self._body_bytes, held_before = 0, 0
        self._body_bytes += len(cycle.body) - held_before
        if self._body_bytes > self._limits.max_body_bytes:
            self._refuse(413, answer=not cycle.response_started)
        else:
            self._body_deadline.arm()

    def _head_late(self) -> None:
        if self._reading_head() and not self.transport.is_closing():
            log.debug("closing a connection whose request head did not arrive in time")
            self.transport.close()

    def _body_late(self) -> None:
        if self._reading_body() and not self.transport.is_closing():
            cycle = self.cycle
            self._refuse(408, answer=cycle is not None and not cycle.response_started)

    def _answerable_head(self) -> bool:
        """A refused head can be answered unless a response is under way before it."""
        return self.cycle is None or bool(self.cycle.response_complete)

    def _refuse(self, status: int, *, answer: bool) -> None:
        """Answer `status` and close where no response is under way, else close at once;
        the request under way, if any, is told its client left (what it sends goes nowhere)."""
        log.debug("refusing a request with %d (answered: %s)", status, answer)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        if answer:
            self.transport.write(refusal(status, self.server_state.default_headers))
            self.transport.close()
        else:
            self.transport.abort()


class HeaderTimeoutProtocol(GatewayProtocol, H11Protocol):
    """uvicorn's h11 protocol with the gateway's additions (pure Python)."""

    def _reading_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _reading_body(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY

    def data_received(self, data: bytes) -> None:
        if self._reading_head():
            self._head_begun()
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle and self.cycle is not None:
            self._frame_writer = _offer_frame_writer(
                self.cycle, self.transport, self.flow, self._writes
            )


class HttpToolsHeaderTimeoutProtocol(GatewayProtocol, HttpToolsProtocol):
    """uvicorn's httptools protocol (a C parser) with the gateway's additions."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        self._in_body = False  # from a head's end to its message's end
        super().__init__(config, *args, **kwargs)

    def _reading_head(self) -> bool:
        return not self._in_body

    def _reading_body(self) -> bool:
        return self._in_body

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun()

    def on_headers_complete(self) -> None:
        self._head_complete()
        self._in_body = True
        cycle = self.cycle
        super().on_headers_complete()
        if self.cycle is not cycle and self.cycle is not None:
            self._frame_writer = _offer_frame_writer(
                self.cycle, self.transport, self.flow, self._writes
            )

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()


def http_protocol(choice: HttpParserChoice) -> type[asyncio.Protocol]:
    """httptools' C parser costs a connection less than h11's pure Python; h11 is stricter
    about what it accepts and has no compiled part."""
    return HttpToolsHeaderTimeoutProtocol if choice == "httptools" else HeaderTimeoutProtocol
