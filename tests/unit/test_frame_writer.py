"""Live frames written straight to a connection: one write per connection per loop turn,
never overtaken by the response's own writes, and keepalives when nothing else went out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from starlette.types import Message

from eco_router.application.ports import FrameWriter
from eco_router.domain.sse import KEEPALIVE_FRAME, Frame
from eco_router.entrypoints.http.frame_writer import (
    ConnectionWrites,
    TransportFrameWriter,
    http_chunk,
)
from eco_router.entrypoints.http.keepalives import Keepalives
from eco_router.entrypoints.http.sse_responses import ClosingStreamingResponse
from tests.unit.factories import eventually


@dataclass
class Wire:
    """What reached one connection, in order: raw writes and the response's own messages."""

    log: list[bytes] = field(default_factory=list)
    closing: bool = False

    # The transport's side.
    def write(self, data: bytes) -> None:
        self.log.append(data)

    def is_closing(self) -> bool:
        return self.closing

    # uvicorn's side: a body message becomes a chunk on the same wire.
    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            self.log.append(http_chunk(message["body"]))


@dataclass
class Cycle:
    response_started: bool = True
    response_complete: bool = False
    disconnected: bool = False


@dataclass
class Flow:
    write_paused: bool = False
    resumed: asyncio.Event = field(default_factory=asyncio.Event)

    async def drained(self) -> None:
        await self.resumed.wait()

    def resume(self) -> None:
        self.write_paused = False
        self.resumed.set()


def writer_on(
    wire: Wire, writes: ConnectionWrites, *, flow: Flow | None = None
) -> TransportFrameWriter:
    return TransportFrameWriter(Cycle(), wire, flow or Flow(), writes)


def frame(encoded: bytes) -> Frame:
    return Frame(None, "message", b"", encoded)


async def next_turn() -> None:
    await asyncio.sleep(0)


class TestOneWritePerTurn:
    async def test_frames_written_in_one_turn_go_out_together_at_its_end(self) -> None:
        wire = Wire()
        writer = writer_on(wire, ConnectionWrites())

        writer.write(frame(b"data: 1\n\n"))
        writer.write(frame(b"data: 2\n\n"))
        assert wire.log == []
        await next_turn()

        assert wire.log == [http_chunk(b"data: 1\n\n") + http_chunk(b"data: 2\n\n")]

    async def test_a_frame_of_one_connection_alone_goes_out_in_order_and_is_not_cached(
        self,
    ) -> None:
        wire = Wire()
        writer = writer_on(wire, ConnectionWrites())
        cached = http_chunk.cache_info().currsize

        writer.write(frame(b"data: shared-by-viewers\n\n"))
        writer.write_all([frame(b"id: f.1\n"), frame(b"data: own\n\n")])
        await next_turn()

        assert wire.log == [
            http_chunk(b"data: shared-by-viewers\n\n") + b"13\r\nid: f.1\ndata: own\n\n\r\n"
        ]
        assert http_chunk.cache_info().currsize == cached + 1  # the shared frame only

    async def test_each_connection_gets_its_own_frames_once(self) -> None:
        writes = ConnectionWrites()
        first, second = Wire(), Wire()
        to_first, to_second = writer_on(first, writes), writer_on(second, writes)

        to_first.write(frame(b"data: a\n\n"))
        to_second.write(frame(b"data: b\n\n"))
        await next_turn()
        to_second.write(frame(b"data: c\n\n"))
        await next_turn()

        assert first.log == [http_chunk(b"data: a\n\n")]
        assert second.log == [http_chunk(b"data: b\n\n"), http_chunk(b"data: c\n\n")]

    async def test_a_connection_gone_before_the_turn_ends_is_sent_nothing(self) -> None:
        wire = Wire()
        writer = writer_on(wire, ConnectionWrites())

        writer.write(frame(b"data: 1\n\n"))
        wire.closing = True
        await next_turn()

        assert wire.log == []


class Running:
    """A response's stream that is only run (`run`), never read."""

    def __init__(self, run: Callable[[FrameWriter], Awaitable[None]]) -> None:
        self.run = run

    def __aiter__(self) -> AsyncIterator[bytes]:
        return never()

    async def aclose(self) -> None:
        return None


async def never() -> AsyncIterator[bytes]:
    """The body a response with a writer never reads: its stream runs on the writer."""
    raise AssertionError("read")
    yield b""


class TestOrderWithTheResponse:
    async def test_the_stream_runs_on_the_writer_and_the_responses_end_comes_after_it(
        self,
    ) -> None:
        wire = Wire()
        writer = writer_on(wire, ConnectionWrites())

        async def run(on: FrameWriter) -> None:
            on.write(frame(b"id: 1\ndata: live\n\n"))
            on.write_all([frame(b"id: 2\nevent: done\n\n")])

        async def close() -> None:
            return None

        async def receive() -> Message:
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        response = ClosingStreamingResponse(
            never(), close=close, writer=writer, stream=Running(run)
        )
        async with asyncio.timeout(5):
            await response({"type": "http"}, receive, wire.send)

        # Flushed before the response's last message, in one write.
        assert wire.log == [
            http_chunk(b"id: 1\ndata: live\n\n") + http_chunk(b"id: 2\nevent: done\n\n")
        ]


class TestDrained:
    async def test_a_paused_connection_is_waited_for_until_it_resumes(self) -> None:
        flow = Flow(write_paused=True)
        writer = writer_on(Wire(), ConnectionWrites(), flow=flow)
        assert not writer.writable()

        waiting = asyncio.create_task(writer.drained())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        flow.resume()

        async with asyncio.timeout(5):
            await waiting
        assert writer.writable()

    async def test_a_connection_gone_is_not_waited_for(self) -> None:
        wire = Wire(closing=True)
        writer = writer_on(wire, ConnectionWrites(), flow=Flow(write_paused=True))

        async with asyncio.timeout(5):
            await writer.drained()


KEEPALIVE = KEEPALIVE_FRAME
TICK = Keepalives.TICK_S


@dataclass
class KeptAlive:
    """A connection that asked for a keepalive every 15 s at loop time `start`."""

    wire: Wire
    writes: ConnectionWrites
    writer: TransportFrameWriter
    start: float

    def sweep(self, after_s: float) -> None:
        self.writes.keepalives.sweep(self.start + after_s)


def kept_alive(flow: Flow | None = None) -> KeptAlive:
    wire, writes = Wire(), ConnectionWrites()
    writer = writer_on(wire, writes, flow=flow)
    writer.keep_alive(15)
    return KeptAlive(wire, writes, writer, asyncio.get_running_loop().time())


class TestKeepalives:
    """The sweep looks at a connection within a tick after it is due: the tests sweep just
    before a due time and a tick after it."""

    async def test_a_connection_idle_for_the_period_gets_the_keepalive(self) -> None:
        conn = kept_alive()

        conn.sweep(14.9)
        await next_turn()
        assert conn.wire.log == []
        conn.sweep(15 + TICK)
        await next_turn()

        assert conn.wire.log == [http_chunk(KEEPALIVE)]
        conn.writer.stop_keepalive()

    async def test_a_write_puts_off_the_keepalive_by_a_whole_period(self) -> None:
        conn = kept_alive()

        conn.writer.write(frame(b"data: 1\n\n"))
        conn.writer.send(conn.start + 10)
        conn.sweep(15 + TICK)
        conn.sweep(24.9)
        await next_turn()
        assert conn.wire.log == [http_chunk(b"data: 1\n\n")]
        conn.sweep(25 + TICK)
        await next_turn()

        assert conn.wire.log == [http_chunk(b"data: 1\n\n"), http_chunk(KEEPALIVE)]
        conn.writer.stop_keepalive()

    async def test_the_responses_own_write_puts_off_the_keepalive_too(self) -> None:
        conn = kept_alive()

        # The response's own write comes more than a tick later (the loop's real time).
        await asyncio.sleep(TICK + 0.1)
        conn.writer.flush()
        conn.sweep(15 + TICK)

        await next_turn()
        assert conn.wire.log == []
        conn.writer.stop_keepalive()

    async def test_keepalives_go_on_every_period_while_nothing_else_is_written(self) -> None:
        conn = kept_alive()

        for period in (1, 2, 3):
            conn.sweep(15 * period + TICK * period)
            await next_turn()

        assert conn.wire.log == [http_chunk(KEEPALIVE)] * 3
        conn.writer.stop_keepalive()

    async def test_a_paused_connection_gets_no_keepalive(self) -> None:
        conn = kept_alive(Flow(write_paused=True))

        conn.sweep(60)
        await next_turn()

        assert conn.wire.log == []
        conn.writer.stop_keepalive()

    async def test_a_stopped_stream_gets_no_keepalive_and_leaves_the_sweep(self) -> None:
        conn = kept_alive()

        conn.writer.stop_keepalive()
        conn.sweep(60)
        await next_turn()

        assert conn.wire.log == []
        assert len(conn.writes.keepalives) == 0

    async def test_the_sweep_runs_by_itself(self) -> None:
        # A short period only makes the test quick: the sweep runs at a quarter of it.
        wire, writes = Wire(), ConnectionWrites()
        writer = writer_on(wire, writes)
        writer.keep_alive(0.04)

        await eventually(lambda: len(wire.log) >= 2)

        assert set(wire.log) == {http_chunk(KEEPALIVE)}
        writer.stop_keepalive()


class TestDisconnect:
    async def test_a_lost_connection_ends_the_stream_without_a_watcher_task(self) -> None:
        wire, closed = Wire(), asyncio.Event()
        cycle = Cycle()
        writer = TransportFrameWriter(cycle, wire, Flow(), ConnectionWrites())
        received: list[str] = []

        async def run(on: FrameWriter) -> None:
            on.write_all([frame(b"id: 1\ndata: first\n\n")])
            await asyncio.Event().wait()

        async def close() -> None:
            closed.set()

        async def receive() -> Message:
            received.append("receive")
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        response = ClosingStreamingResponse(
            never(), close=close, writer=writer, stream=Running(run)
        )
        serving = asyncio.create_task(response({"type": "http"}, receive, wire.send))
        await eventually(lambda: wire.log)
        tasks_while_streaming = len(asyncio.all_tasks())
        cycle.disconnected = True
        writer.connection_lost()

        async with asyncio.timeout(5):
            await serving
        assert closed.is_set()
        assert received == []  # nobody waited for http.disconnect
        assert tasks_while_streaming == 2  # this test's and the response's, no watcher
        assert wire.log == [http_chunk(b"id: 1\ndata: first\n\n")]

    async def test_a_client_gone_before_the_response_is_told_by_the_server(self) -> None:
        wire, closed = Wire(), asyncio.Event()
        writer = TransportFrameWriter(Cycle(disconnected=True), wire, Flow(), ConnectionWrites())

        async def run(on: FrameWriter) -> None:
            await asyncio.Event().wait()

        async def close() -> None:
            closed.set()

        async def receive() -> Message:
            return {"type": "http.disconnect"}

        response = ClosingStreamingResponse(
            never(), close=close, writer=writer, stream=Running(run)
        )
        async with asyncio.timeout(5):
            await response({"type": "http"}, receive, wire.send)

        assert closed.is_set()
        assert wire.log == []
