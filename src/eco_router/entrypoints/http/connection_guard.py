"""The gateway's hold on each HTTP/1.1 connection, whichever parser uvicorn runs
(`EVENT_ROUTER_HTTP_PARSER`), through public interfaces only: deadlines for each request's
head and body, limits on what a request sends, connection caps (in all and per client
address), and the frame writer handed to each GET.

Two pieces, neither a subclass of uvicorn's nor a reader of its objects:

- `GuardedConnection`, an asyncio protocol of ours between the transport and the protocol
  uvicorn runs for the parser (uvicorn's `http` setting takes a protocol class). It reads the
  bytes first (`request_framing.py`, llhttp) and hands the server only what the limits allow;
  what it needs of the server is asyncio's protocol interface (`connection_made`,
  `data_received`, `connection_lost`, ...), which is also how it tells the server that a
  refused client has gone.
- `ConnectionLayer`, an ASGI layer around the app: it follows each response (started, whole)
  for the connection, answers `413` to a body declared too large, and hands each GET its
  frame writer. A request finds its connection in the context its task was created in: the
  guard sets it while the server reads the bytes, and asyncio's tasks copy the context.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import http
import importlib
import logging
from collections.abc import Awaitable
from typing import Any, ClassVar, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import HTTP_PROTOCOLS

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
from eco_router.entrypoints.http.request_framing import FramingError, Phase, RequestFraming
from eco_router.entrypoints.http.request_limits import RequestLimits

log = logging.getLogger(__name__)

# The connection whose bytes the server is reading: a request task it creates meanwhile
# copies the context, and its `ConnectionLayer` finds the connection there.
_CONNECTION: contextvars.ContextVar[GuardedConnection | None] = contextvars.ContextVar(
    "eco_router_connection", default=None
)


class ConnectionGuards:
    """What the connections of one server share: the limits, and the connections open, in
    all (past `drop_above` a new one is closed at once, unanswered) and per address."""

    __slots__ = ("clients", "drop_above", "header_timeout_s", "limits", "open")

    def __init__(
        self,
        *,
        header_timeout_s: float,
        limits: RequestLimits,
        drop_above: int | None = None,
        clients: ClientConnections | None = None,
    ) -> None:
        self.header_timeout_s = header_timeout_s
        self.limits = limits
        self.drop_above = drop_above
        self.clients = clients if clients is not None else ClientConnections(0)
        self.open = 0


def server_protocol(parser: HttpParserChoice) -> type[asyncio.Protocol]:
    """The protocol class uvicorn runs for `--http <parser>` (its own table of them)."""
    module, _, name = HTTP_PROTOCOLS[parser].partition(":")
    protocol = getattr(importlib.import_module(module), name)
    if not (isinstance(protocol, type) and issubclass(protocol, asyncio.Protocol)):
        raise TypeError(f"uvicorn's --http {parser} is not an asyncio protocol: {protocol!r}")
    return protocol


def guarded_protocol(parser: HttpParserChoice, guards: ConnectionGuards) -> type[GuardedConnection]:
    """The class for uvicorn's `http` setting: its protocol for `parser`, held to `guards`."""

    class Guarded(GuardedConnection):
        pass

    Guarded.server_protocol = server_protocol(parser)
    Guarded.guards = guards
    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{Guarded.server_protocol.__name__}"
    return Guarded


class GuardedConnection(asyncio.Protocol):
    """One connection: the server's protocol (`server_protocol`) behind the gateway's limits
    (`guards`).

    - A head must be complete within the header timeout of the connection's opening or of
      its first byte (else the connection is closed); a body within the body timeout of its
      head (`408` if no response has begun, else the connection is closed at once).
    - A head's bytes, lines and request line are metered before anything reads them (`414`,
      `431`); a body that grows past the limit, chunked or not, gets `413`; bytes llhttp
      cannot read as a request get `400`. Each refusal closes the connection, at once where a
      response is under way (nothing can be answered then), and the server is told its
      client has gone.
    - Past the connections the server drops at once, or past its address's cap, a new
      connection is closed at once, unanswered, before the server hears of it.
    - A request that asks to switch protocols (the gateway speaks none) is the connection's
      last: what follows it is not read, and the connection closes once it is answered.
    """

    server_protocol: ClassVar[type[asyncio.Protocol]]
    guards: ClassVar[ConnectionGuards]

    __slots__ = (
        "_answered",
        "_drain",
        "_exchange",
        "_framing",
        "_host",
        "_inner",
        "_last",
        "_meter",
        "_server",
        "_timer",
        "_timer_phase",
        "transport",
        "write_paused",
    )

    def __init__(self, **server: Any) -> None:
        # uvicorn's arguments for its protocol, passed on as they are once connected.
        self._server: dict[str, Any] | None = server
        self._inner: asyncio.Protocol | None = None  # None once it is told the client left
        limits = self.guards.limits
        self._framing = RequestFraming(limits.max_body_bytes)
        self._meter = HeadMeter(limits)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase: Phase | None = None
        self._host: str | None = None
        self._exchange: Exchange | None = None
        self._answered = 0  # responses complete
        self._last = False
        self.transport: asyncio.Transport
        # What the frame writer reads, as it would of the server's flow control.
        self.write_paused = False
        # Made only while a stream waits for the transport to take writes again.
        self._drain: asyncio.Future[None] | None = None

    # asyncio's protocol interface, toward the transport.
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        server, self._server = self._server, None
        guards = self.guards
        guards.open += 1
        if guards.drop_above is not None and guards.open > guards.drop_above:
            log.debug("dropping a connection: %d open", guards.open)
            transport.abort()
            return
        host = _peer_host(transport)
        if host is not None:
            if not guards.clients.admit(host):
                log.debug("dropping a connection: %s holds too many", host)
                transport.abort()
                return
            self._host = host
        assert server is not None
        inner = self._inner = self.server_protocol(**server)
        inner.connection_made(transport)
        self._arm(Phase.HEAD)

    def data_received(self, data: bytes) -> None:
        if self._inner is None or self._last:
            return  # refused or gone, or past a request that switched protocols
        token = _CONNECTION.set(self)
        try:
            self._receive(data, self._inner)
        finally:
            _CONNECTION.reset(token)

    def eof_received(self) -> bool | None:
        inner = self._inner
        return inner.eof_received() if inner is not None else None

    def pause_writing(self) -> None:
        self.write_paused = True
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._drained()
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        guards = self.guards
        guards.open -= 1
        if self._host is not None:
            guards.clients.release(self._host)
            self._host = None
        self._end(exc)

    async def drained(self) -> None:
        """Until the transport takes writes again, or the connection is gone."""
        if not self.write_paused or self.transport.is_closing():
            return
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        # Shielded: a waiter cancelled (its client left) must not cancel the others' wait.
        await asyncio.shield(self._drain)

    def _drained(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # What the connection's `ConnectionLayer` tells it.
    def exchange(self, send: Send) -> Exchange:
        """A request's response begins to be made (the request's task runs)."""
        exchange = Exchange(self, send)
        if self._inner is None:
            exchange.disconnected = True
        else:
            self._exchange = exchange
        return exchange

    def answered(self, exchange: Exchange) -> None:
        """`exchange`'s response is whole."""
        self._answered += 1
        if self._exchange is exchange:
            self._exchange = None
        if self._last and self._answered >= self._framing.heads:
            self.transport.close()

    # The rules.
    def _receive(self, data: bytes, inner: asyncio.Protocol) -> None:
        """Meter what is in a head, frame everything, and hand the server what passed."""
        framing, meter = self._framing, self._meter
        began_in, heads = framing.phase, framing.heads
        if began_in is Phase.HEAD or (began_in is Phase.BETWEEN and self._answered >= heads):
            # A head's deadline runs from its first byte; on a connection with nothing to
            # answer, blank lines count as one (they would hold it open forever otherwise).
            self._arm(Phase.HEAD)
        while data:
            in_head = framing.phase is not Phase.BODY
            # A body goes whole: the framing counts it as it reads it.
            taken = meter.take(data) if in_head else len(data)
            heads_before = framing.heads
            if taken:
                piece = data if taken == len(data) else data[:taken]
                try:
                    switched = framing.feed(piece)
                except FramingError as error:
                    log.debug("refusing what llhttp cannot read as a request: %s", error)
                    in_body = framing.phase is Phase.BODY
                    self._refuse(400, framing.heads + (0 if in_body else 1))
                    return
                if framing.oversized:
                    self._refuse(413, framing.oversized)
                    return
                if switched is not None:
                    inner.data_received(piece[:switched])
                    self._switched()
                    return
                inner.data_received(piece)
                if self.transport.is_closing():
                    return  # the server refused it, or it was its last
            data = data[taken:]
            if framing.heads != heads_before:
                meter.reset()
            elif data and in_head:
                # A limit was reached inside this head.
                self._refuse(meter.refusal(), framing.heads + 1)
                return
        phase = framing.phase
        if phase is not Phase.BETWEEN:
            self._arm(phase)
        elif framing.heads != heads or began_in is Phase.BODY:
            self._disarm()  # else blank lines alone came, and the head's deadline still runs

    def _switched(self) -> None:
        self._last = True
        self._disarm()
        if self._answered >= self._framing.heads:
            self.transport.close()

    def _arm(self, phase: Phase) -> None:
        """The deadline of the head, or of the body, under way (kept if it runs already)."""
        timer = self._timer
        if timer is not None:
            if self._timer_phase is phase:
                return
            timer.cancel()
        guards = self.guards
        timeout_s = guards.limits.body_timeout_s if phase is Phase.BODY else guards.header_timeout_s
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._late)
        self._timer_phase = phase

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_phase = None

    def _late(self) -> None:
        phase, self._timer, self._timer_phase = self._timer_phase, None, None
        if self._inner is None or self.transport.is_closing():
            return
        framing = self._framing
        if phase is Phase.BODY:
            if framing.phase is Phase.BODY:
                self._refuse(408, framing.heads)
        elif framing.phase is not Phase.BODY:
            log.debug("closing a connection whose request head did not arrive in time")
            self.transport.close()

    def _answerable(self, request: int) -> bool:
        """A refusal can answer request number `request` if every response before it is
        whole and none of its own has begun."""
        exchange = self._exchange
        return self._answered == request - 1 and (exchange is None or not exchange.answering)

    def _refuse(self, status: int, request: int) -> None:
        """Answer `status` and close where that answers `request`, else close at once; the
        server is told its client has gone (what the request under way sends goes nowhere)."""
        answer = self._answerable(request)
        log.debug("refusing a request with %d (answered: %s)", status, answer)
        transport = self.transport
        if answer:
            transport.write(refusal(status, ((b"date", _http_date()),)))
            transport.close()
        else:
            transport.abort()
        self._end(None)

    def _end(self, exc: Exception | None) -> None:
        """The client has gone (or was refused): the server and the response under way hear
        of it, once."""
        self._disarm()
        self._drained()
        self._framing.close()
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.disconnected = True
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.connection_lost(exc)
        if exchange is not None and exchange.writer is not None:
            exchange.writer.connection_lost()


class Exchange:
    """One request's response as its connection and its frame writer follow it: its start
    handed to the server (`answering`, until it is whole), its head written
    (`response_started`), its last message under way (`response_complete`), the client gone
    (`disconnected`). `send` is the app's, ahead of the server's."""

    __slots__ = (
        "_connection",
        "_send",
        "answering",
        "disconnected",
        "response_complete",
        "response_started",
        "writer",
    )

    def __init__(self, connection: GuardedConnection, send: Send) -> None:
        self._connection = connection
        self._send = send
        self.answering = False
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.writer: TransportFrameWriter | None = None

    def send(self, message: Message) -> Awaitable[None]:
        """The app's `send`: a body message before the last goes straight to the server (its
        own coroutine, no frame of this one); the start and the last are marked."""
        if self.response_started and message.get("more_body", False):
            return self._send(message)
        return self._marked(message)

    async def _marked(self, message: Message) -> None:
        if self.response_started:
            # The last message: nothing is written beside the response from now on.
            self.response_complete = True
            await self._send(message)
            self.answering = False
            self._connection.answered(self)
            return
        self.answering = True
        await self._send(message)
        # Written (the server writes a head as it is sent): frames may follow it.
        self.response_started = True


class ConnectionLayer:
    """The ASGI side of the gateway's connections, around the whole app: each HTTP request's
    response is followed for its connection (`Exchange`), a body declared past the limit
    gets `413` without running the app, and a GET over HTTP/1.1 (a chunked response) is
    handed a writer of raw chunks on its connection (the `FRAME_WRITER` scope extension).

    A request whose task was not created by a `GuardedConnection` goes to the app as it is.
    Not a coroutine function: it returns the app's coroutine, so a stream keeps no frame of
    this layer (uvicorn is told the interface is ASGI 3).
    """

    __slots__ = ("_app", "_max_body_bytes", "_writes")

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, writes: ConnectionWrites | None = None
    ) -> None:
        self._app = app
        self._max_body_bytes = max_body_bytes
        # What the connections share for their direct writes (the turn's batch, keepalives).
        self._writes = writes if writes is not None else ConnectionWrites()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        app = self._app
        if scope["type"] != "http":
            return app(scope, receive, send)
        if declared_body_bytes(scope["headers"]) > self._max_body_bytes:
            app = _body_too_large
        connection = _CONNECTION.get()
        if connection is None:
            return app(scope, receive, send)
        exchange = connection.exchange(send)
        if scope["method"] == "GET" and scope["http_version"] == "1.1":
            writer = TransportFrameWriter(exchange, connection.transport, connection, self._writes)
            exchange.writer = writer
            scope.setdefault("extensions", {})[FRAME_WRITER] = writer
        return app(scope, receive, exchange.send)


async def _body_too_large(scope: Scope, receive: Receive, send: Send) -> None:
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


def _peer_host(transport: asyncio.BaseTransport) -> str | None:
    """The TCP peer's address (None on a unix socket)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple | list) and len(peer) >= 2:
        return str(peer[0])
    return None


def _http_date() -> bytes:
    return email.utils.formatdate(usegmt=True).encode()
