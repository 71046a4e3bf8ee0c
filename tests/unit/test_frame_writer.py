"""Live frames written straight to a connection: one write per connection per loop turn, and
never overtaken by the response's own writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.types import Message

from eco_router.entrypoints.http.frame_writer import TransportFrameWriter, WriteBatch, http_chunk
from eco_router.entrypoints.http.sse_responses import ClosingStreamingResponse


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


def writer_on(wire: Wire, batch: WriteBatch) -> TransportFrameWriter:
    return TransportFrameWriter(Cycle(), wire, Flow(), batch)


async def next_turn() -> None:
    await asyncio.sleep(0)


class TestOneWritePerTurn:
    async def test_frames_written_in_one_turn_go_out_together_at_its_end(self) -> None:
        wire = Wire()
        writer = writer_on(wire, WriteBatch())

        writer.write(b"data: 1\n\n")
        writer.write(b"data: 2\n\n")
        assert wire.log == []
        await next_turn()

        assert wire.log == [http_chunk(b"data: 1\n\n") + http_chunk(b"data: 2\n\n")]

    async def test_each_connection_gets_its_own_frames_once(self) -> None:
        batch = WriteBatch()
        first, second = Wire(), Wire()
        to_first, to_second = writer_on(first, batch), writer_on(second, batch)

        to_first.write(b"data: a\n\n")
        to_second.write(b"data: b\n\n")
        await next_turn()
        to_second.write(b"data: c\n\n")
        await next_turn()

        assert first.log == [http_chunk(b"data: a\n\n")]
        assert second.log == [http_chunk(b"data: b\n\n"), http_chunk(b"data: c\n\n")]

    async def test_a_connection_gone_before_the_turn_ends_is_sent_nothing(self) -> None:
        wire = Wire()
        writer = writer_on(wire, WriteBatch())

        writer.write(b"data: 1\n\n")
        wire.closing = True
        await next_turn()

        assert wire.log == []


class TestOrderWithTheResponse:
    async def test_the_responses_own_write_comes_after_the_frames_written_before_it(
        self,
    ) -> None:
        wire = Wire()
        writer = writer_on(wire, WriteBatch())

        async def frames() -> AsyncIterator[bytes]:
            writer.write(b"id: 1\ndata: live\n\n")
            yield b"id: 2\nevent: done\n\n"

        async def close() -> None:
            return None

        async def receive() -> Message:
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        response = ClosingStreamingResponse(frames(), close=close, writer=writer)
        async with asyncio.timeout(5):
            await response({"type": "http"}, receive, wire.send)

        assert wire.log == [
            http_chunk(b"id: 1\ndata: live\n\n"),
            http_chunk(b"id: 2\nevent: done\n\n"),
        ]
