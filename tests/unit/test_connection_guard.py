"""The gateway's connection guard and ASGI layer on a real uvicorn server, with either parser:
the frame writer each GET is handed, what a refusal answers (and when it cannot), and what
the app is told. The limits at their documented defaults are the integration tests'
(`tests/integration/test_gateway_request_bounds.py`); short timeouts keep these short."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from eco_router.domain.sse import Frame
from eco_router.entrypoints.http.frame_writer import FRAME_WRITER, TransportFrameWriter
from eco_router.entrypoints.http.server_config import server_config
from eco_router.entrypoints.settings import load_settings
from tests.raw_http import connected, until_closed
from tests.unit.factories import eventually

# Only bounds how long a test waits for the server to act; never what it asserts.
PATIENCE_S = 10
SHORT_S = 0.3  # the header and body timeouts here

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


@pytest.fixture(params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


class App:
    """An ASGI app that answers each HTTP request with `handler`, and keeps what each saw."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.writers: list[TransportFrameWriter | None] = []
        self.received: list[Message] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.writers.append(scope.get("extensions", {}).get(FRAME_WRITER))
        await self.handler(scope, receive, send)


async def ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def serving(app: App, parser: str, **settings: object) -> AsyncIterator[tuple[str, int]]:
    """`serve`'s uvicorn configuration for `app`, on a loopback port, until the block ends."""
    config = server_config(
        app,
        load_settings(
            http_parser=parser,
            http_header_timeout_s=SHORT_S,
            http_body_timeout_s=SHORT_S,
            # A stream whose client left unseen (h11 stops reading at a pipelined byte) ends.
            http_shutdown_timeout_s=1,
            **settings,
        ),
        host="127.0.0.1",
        port=0,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started or task.done(), timeout_s=PATIENCE_S)
        assert server.started
        yield sock.getsockname()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, PATIENCE_S)
        sock.close()


async def head_of(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE_S)


GET = b"GET /a HTTP/1.1\r\nHost: gateway\r\n\r\n"


class TestFrameWriter:
    async def test_a_get_is_handed_a_writer_whose_chunks_follow_the_responses_head(
        self, parser: str
    ) -> None:
        async def stream(scope: Scope, receive: Receive, send: Send) -> None:
            writer = scope["extensions"][FRAME_WRITER]
            assert not writer.writable()  # no head yet
            await send({"type": "http.response.start", "status": 200, "headers": []})
            assert writer.writable()
            writer.write(Frame(1, "m", b"1", b"data: 1\n\n"))
            await asyncio.sleep(0.01)  # the turn's batch goes out
            await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            assert not writer.writable()

        app = App(stream)
        async with serving(app, parser) as address, connected(address) as (reader, writer):
            writer.write(GET.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            answer = await until_closed(reader)

        assert answer.startswith(b"HTTP/1.1 200 OK")
        assert answer.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n")

    async def test_each_pipelined_get_is_handed_its_own_writer(self, parser: str) -> None:
        app = App(ok)
        async with serving(app, parser) as address, connected(address) as (reader, writer):
            writer.write(GET * 2 + b"GET /a HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
            answers = await until_closed(reader)

        assert answers.count(b"HTTP/1.1 200 OK") == 3
        assert len(app.writers) == 3
        assert all(isinstance(w, TransportFrameWriter) for w in app.writers)
        assert len({id(w) for w in app.writers}) == 3

    async def test_a_post_or_an_http_1_0_request_gets_no_writer(self, parser: str) -> None:
        app = App(ok)
        async with serving(app, parser) as address:
            async with connected(address) as (reader, writer):
                writer.write(b"POST /a HTTP/1.1\r\nHost: g\r\nContent-Length: 0\r\n\r\n")
                await head_of(reader)
            async with connected(address) as (reader, writer):
                writer.write(b"GET /a HTTP/1.0\r\n\r\n")
                await until_closed(reader)

        assert app.writers == [None, None]

    async def test_a_client_gone_is_told_to_the_writer_by_its_connection(self, parser: str) -> None:
        left = asyncio.Event()

        async def stream(scope: Scope, receive: Receive, send: Send) -> None:
            writer = scope["extensions"][FRAME_WRITER]
            assert writer.on_disconnect(left.set)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await asyncio.wait_for(left.wait(), PATIENCE_S)
            assert not writer.writable()

        app = App(stream)
        async with serving(app, parser) as address:
            async with connected(address) as (reader, writer):
                writer.write(GET)
                await head_of(reader)
            await asyncio.wait_for(left.wait(), PATIENCE_S)


async def stream_forever(scope: Scope, receive: Receive, send: Send) -> None:
    """A response that starts and never ends (an SSE stream), until its client leaves."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    while (await receive())["type"] != "http.disconnect":
        pass


class TestRefusals:
    async def test_a_refusal_while_a_response_is_under_way_closes_unanswered(
        self, parser: str
    ) -> None:
        app = App(stream_forever)
        async with serving(app, parser) as address, connected(address) as (reader, writer):
            writer.write(GET)
            await head_of(reader)
            # A pipelined head past the limit on header lines (100).
            writer.write(b"GET /b HTTP/1.1\r\n" + b"X-N: 1\r\n" * 150)
            rest = await until_closed(reader)

        assert b"HTTP/1.1" not in rest  # no 431 inside the stream

    async def test_an_unfinished_body_is_408_and_the_app_hears_its_client_left(
        self, parser: str
    ) -> None:
        heard: list[Message] = []

        async def read_body(scope: Scope, receive: Receive, send: Send) -> None:
            while (message := await receive())["type"] == "http.request":
                heard.append(message)
            heard.append(message)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"late"})

        app = App(read_body)
        async with serving(app, parser) as address, connected(address) as (reader, writer):
            writer.write(b"POST /a HTTP/1.1\r\nHost: g\r\nContent-Length: 10\r\n\r\n12345")
            answer = await until_closed(reader)
            await eventually(lambda: heard and heard[-1]["type"] == "http.disconnect")

        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert b"\r\ndate: " in answer
        assert b"late" not in answer

    async def test_a_body_late_once_its_response_has_begun_is_cut_unanswered(
        self, parser: str
    ) -> None:
        async def answer_first(scope: Scope, receive: Receive, send: Send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"early", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass

        app = App(answer_first)
        async with serving(app, parser) as address, connected(address) as (reader, writer):
            writer.write(b"POST /a HTTP/1.1\r\nHost: g\r\nContent-Length: 10\r\n\r\n12345")
            answer = await until_closed(reader)

        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"408" not in answer

    async def test_a_chunked_body_past_the_limit_is_413_and_the_app_gets_none_of_the_excess(
        self, parser: str
    ) -> None:
        bodies: list[int] = []

        async def read_body(scope: Scope, receive: Receive, send: Send) -> None:
            while (message := await receive())["type"] == "http.request":
                bodies.append(len(message["body"]))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"late"})

        chunk = b"%x\r\n%s\r\n" % (10_000, b"a" * 10_000)
        async with serving(App(read_body), parser) as address, connected(address) as (reader, w):
            w.write(
                b"POST /a HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 7
            )
            answer = await until_closed(reader)

        assert answer.startswith(b"HTTP/1.1 413 ")
        assert sum(bodies) <= 64 * 1024  # the default limit

    async def test_bytes_that_are_not_a_request_are_400(self, parser: str) -> None:
        app = App(ok)
        async with serving(app, parser) as address, connected(address) as (reader, writer):
            writer.write(b"HELLO THERE\r\n\r\n")
            answer = await until_closed(reader)

        assert answer.startswith(b"HTTP/1.1 400 ")
        assert app.writers == []

    async def test_blank_lines_alone_do_not_hold_a_connection_past_the_header_timeout(
        self, parser: str
    ) -> None:
        async with serving(App(ok), parser) as address, connected(address) as (reader, writer):
            closed = asyncio.ensure_future(until_closed(reader))
            with contextlib.suppress(ConnectionError):
                for _ in range(int(PATIENCE_S / 0.05)):
                    if closed.done():
                        break
                    writer.write(b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)

            # Closed: by the header timeout, or answered 400 by a parser that counts them.
            assert b"HTTP/1.1 200" not in await closed

    async def test_a_stray_blank_line_during_a_response_leaves_it_be(self, parser: str) -> None:
        async with (
            serving(App(stream_forever), parser) as address,
            connected(address) as (reader, writer),
        ):
            writer.write(GET)
            await asyncio.wait_for(reader.readuntil(b"data: 1\n\n\r\n"), PATIENCE_S)
            writer.write(b"\r\n")
            await asyncio.sleep(3 * SHORT_S)

            assert not reader.at_eof()

    async def test_a_request_that_switches_protocols_is_the_connections_last(
        self, parser: str
    ) -> None:
        app = App(ok)
        upgrade = b"GET /a HTTP/1.1\r\nHost: g\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        async with serving(app, parser) as address, connected(address) as (reader, writer):
            writer.write(upgrade + GET)
            answers = await until_closed(reader)

        assert answers.count(b"HTTP/1.1 200 OK") == 1
        assert len(app.writers) == 1
