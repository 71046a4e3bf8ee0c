"""A stream's frames held for a reader of chunks: one chunk waits at most, keepalives while
nothing comes, the run's error reaches the reader, and closing the reader stops the run."""

from __future__ import annotations

import asyncio

import pytest

from eco_router.application.frame_buffer import FrameBuffer
from eco_router.application.ports import FrameWriter
from eco_router.domain.sse import KEEPALIVE_FRAME, Frame


def frame(encoded: bytes) -> Frame:
    return Frame(None, "message", b"", encoded)


class TestChunks:
    async def test_what_is_written_before_a_read_comes_as_one_chunk(self) -> None:
        async def run(writer: FrameWriter) -> None:
            writer.write(frame(b"a"))
            writer.write_all([frame(b"b"), frame(b"c")])

        assert [chunk async for chunk in FrameBuffer().chunks(run)] == [b"abc"]

    async def test_it_takes_writes_only_while_nothing_waits_for_the_reader(self) -> None:
        buffer = FrameBuffer()
        seen: list[bool] = []
        read = asyncio.Event()

        async def run(writer: FrameWriter) -> None:
            seen.append(writer.writable())
            writer.write(frame(b"a"))
            seen.append(writer.writable())
            await writer.drained()
            seen.append(read.is_set())
            seen.append(writer.writable())

        chunks = buffer.chunks(run)
        assert await anext(chunks) == b"a"
        read.set()
        assert [chunk async for chunk in chunks] == []
        assert seen == [True, False, True, True]

    async def test_nothing_written_for_the_keepalive_period_is_a_keepalive(self) -> None:
        # A short period only makes the test quick.
        async def run(writer: FrameWriter) -> None:
            writer.keep_alive(0.02)
            await asyncio.sleep(0.07)
            writer.write(frame(b"end"))

        chunks = [chunk async for chunk in FrameBuffer().chunks(run)]

        assert chunks[-1] == b"end"
        assert set(chunks[:-1]) == {KEEPALIVE_FRAME}
        assert 2 <= len(chunks) - 1 <= 3

    async def test_the_runs_error_is_raised_to_the_reader_after_what_it_wrote(self) -> None:
        async def run(writer: FrameWriter) -> None:
            writer.write(frame(b"a"))
            raise RuntimeError("lost")

        got: list[bytes] = []

        async def read() -> None:
            async for chunk in FrameBuffer().chunks(run):
                got.append(chunk)

        with pytest.raises(RuntimeError, match="lost"):
            await read()
        assert got == [b"a"]

    async def test_closing_the_reader_cancels_the_run_and_wakes_its_wait(self) -> None:
        cancelled = asyncio.Event()

        async def run(writer: FrameWriter) -> None:
            writer.write(frame(b"a"))
            try:
                await writer.drained()  # the reader never reads again
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        chunks = FrameBuffer().chunks(run)
        assert await anext(chunks) == b"a"
        await chunks.aclose()

        assert cancelled.is_set()
