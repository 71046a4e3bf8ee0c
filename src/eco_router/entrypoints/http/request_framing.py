"""Where a connection's bytes stand among HTTP/1.1 requests, read by the gateway itself before
the server gets them: the state its deadlines and limits are decided on (`connection_guard.py`)."""

from __future__ import annotations

import contextlib
import enum

import httptools


class Phase(enum.Enum):
    """Where the bytes received so far end."""

    BETWEEN = "between requests"  # nothing of the next request yet
    HEAD = "in a head"  # its request line and headers, not yet complete
    BODY = "in a body"  # its head complete, its body not yet whole


class FramingError(Exception):
    """The bytes are not an HTTP/1.1 request llhttp accepts (answered 400)."""


class RequestFraming:
    """The requests on one connection as llhttp (httptools' parser, the one uvicorn's
    httptools protocol runs) frames them: where the bytes fed so far end (`phase`), how many
    heads have been complete (`heads`), the current body's length so far (`body_bytes`), and
    the first request whose body passed `max_body_bytes`, chunked or not (`oversized`, its
    number counted from 1; 0 while there is none).

    It keeps no request: no URL, no header is copied out of the parser. Between requests it
    holds no parser either (a new one reads the next request), so an idle connection costs
    nothing here.
    """

    __slots__ = ("_max_body_bytes", "_parser", "body_bytes", "heads", "oversized", "phase")

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body_bytes = max_body_bytes
        self._parser: httptools.HttpRequestParser | None = None
        self.phase = Phase.BETWEEN
        self.heads = 0
        self.body_bytes = 0
        self.oversized = 0

    def feed(self, data: bytes) -> int | None:
        """Read `data`. Returns None, or where in `data` a request asking to switch protocols
        (an `Upgrade`, a `CONNECT`) ends: what follows is not HTTP/1.1, and is not read.
        Raises `FramingError` on bytes that are not a request."""
        parser = self._parser
        if parser is None:
            parser = self._parser = _parser_for(self)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._parser = None
            return int(upgrade.args[0])
        except httptools.HttpParserError as error:
            self._parser = None
            raise FramingError(str(error)) from error
        if self.phase is Phase.BETWEEN:
            self._parser = None
        return None

    def close(self) -> None:
        """The connection is gone: the parser (which holds this object's callbacks) goes."""
        self._parser = None

    # llhttp's callbacks, in the order it makes them for each request.
    def on_message_begin(self) -> None:
        self.phase = Phase.HEAD

    def on_headers_complete(self) -> None:
        self.heads += 1
        self.phase = Phase.BODY
        self.body_bytes = 0

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self._max_body_bytes and not self.oversized:
            self.oversized = self.heads

    def on_message_complete(self) -> None:
        self.phase = Phase.BETWEEN


def _parser_for(framing: RequestFraming) -> httptools.HttpRequestParser:
    parser = httptools.HttpRequestParser(framing)
    # As uvicorn's httptools protocol reads: bytes after a `Connection: close` request are
    # not an error (the server closes after answering it).
    with contextlib.suppress(AttributeError):  # httptools < 0.6.3: such bytes get 400
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser
