"""Turning an SSE request into a streaming response: job id, resume point, token, errors."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol

from fastapi import HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from eco_router.application.ports import Authorizer, FrameWriter
from eco_router.application.stream_job_events import StreamJobEvents
from eco_router.entrypoints.http.client_streams import ClientStreams, hold_stream
from eco_router.entrypoints.http.frame_writer import FRAME_WRITER, TransportFrameWriter

JOB_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# A seq is at most a signed 64-bit integer; longer ids are not ours (and `int()` of thousands
# of digits raises instead of parsing).
LAST_EVENT_ID = re.compile(r"[0-9]{1,19}")
MAX_SEQ = 2**63 - 1
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
SSE_MEDIA_TYPE = "text/event-stream"
# Encoded once: Starlette would encode them again for each response, which keeps its own
# copies for the life of the stream.
SSE_RAW_HEADERS = (
    *(
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in SSE_HEADERS.items()
    ),
    (b"content-type", f"{SSE_MEDIA_TYPE}; charset=utf-8".encode("latin-1")),
)


async def job_event_stream(
    request: Request,
    *,
    domain: str,
    job_id: str,
    last_event_id: str | None,
    domains: tuple[str, ...],
    cookie: str,
    authorizer: Authorizer,
    stream: StreamJobEvents,
    client_streams: ClientStreams,
) -> Response:
    """Validate everything and open the stream before the first byte; then stream its frames.

    A resuming client that already has the job's end gets 204 No Content: by the SSE
    standard, a browser's EventSource then stops reconnecting. A client address with too
    many streams open gets 429 (first: whether the job has ended is read with its replay);
    an unreachable Pub/Sub or state store, 503 (both with `Retry-After`).
    """
    if JOB_ID.fullmatch(job_id) is None:
        raise HTTPException(422, "job_id must be 1-128 characters of [A-Za-z0-9_.:-]")
    if domain not in domains:
        raise HTTPException(404, f"unknown domain {domain!r}; known: {', '.join(domains)}")
    after = resume_point(request.headers.get("last-event-id") or last_event_id)
    authorizer.authorize(bearer_token(request, cookie), job_id, domain=domain)
    # The end is told from the read that gives the replay: one read of the store per open.
    return await streaming_response(
        request, client_streams, lambda: stream.open_unless_ended(domain, job_id, after)
    )


class ResponseStream(Protocol):
    """A stream opened for one response: `run` writes its frames to the connection's writer;
    iterated, it yields them as chunks (for a server that hands the response no writer)."""

    def run(self, writer: FrameWriter) -> Awaitable[None]: ...

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


async def streaming_response(
    request: Request,
    client_streams: ClientStreams,
    open_stream: Callable[[], Awaitable[ResponseStream | None]],
) -> Response:
    """Hold one stream of the client's address (429 past its cap), open the stream and
    stream it; the hold ends when the stream does, however the response ends. A stream that
    opens to None has nothing to send: 204 No Content."""
    client = hold_stream(request, client_streams)
    try:
        opened = await open_stream()
    except BaseException:
        client_streams.release(client)
        raise
    if opened is None:
        client_streams.release(client)
        return Response(status_code=204)
    writer = request.scope.get("extensions", {}).get(FRAME_WRITER)

    async def close() -> None:
        try:
            await opened.aclose()
        finally:
            client_streams.release(client)

    return ClosingStreamingResponse(opened, close=close, writer=writer, stream=opened)


def resume_point(value: str | None) -> int | None:
    """The seq a client resumes after, from its Last-Event-ID; 422 unless it is one of ours."""
    if not value:
        return None
    if LAST_EVENT_ID.fullmatch(value) is None or int(value) > MAX_SEQ:
        raise HTTPException(422, "Last-Event-ID must be a non-negative integer (a seq)")
    return int(value)


class ClosingStreamingResponse(StreamingResponse):
    """An SSE response that ends its stream however the response ends, even before its first
    frame (a client gone at once): nothing it holds outlives the request.

    Where the server hands the request a frame writer, `stream` writes its frames through it
    between the response's head and its end; else `frames` are the body. Streams
    in the request's own task, cancelled when the client disconnects: told by the connection
    itself where there is a writer, else by one small task waiting for `http.disconnect`.
    Starlette's own streaming runs the body in a task group of two tasks, costing memory and
    CPU on each of thousands of connections.
    """

    def __init__(
        self,
        frames: AsyncIterable[bytes],
        *,
        close: Callable[[], Awaitable[None]],
        writer: TransportFrameWriter | None = None,
        stream: ResponseStream | None = None,
    ) -> None:
        super().__init__(frames, media_type=SSE_MEDIA_TYPE)
        self._stream = stream
        self._close = close
        self._disconnected = False
        self._writer = writer

    def init_headers(self, headers: Mapping[str, str] | None = None) -> None:
        # A list of its own: middlewares (CORS) add to a response's headers in place.
        self.raw_headers = list(SSE_RAW_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        writer = self._writer
        watcher: asyncio.Task[None] | None = None
        if writer is None or not writer.on_disconnect(lambda: self._left(task)):
            watcher = asyncio.create_task(self._watch(receive, task))
        if writer is not None:
            send = _flushing_first(writer, send)
        try:
            try:
                await self.stream_response(send)
            finally:
                if watcher is not None:
                    watcher.cancel()
                    await asyncio.wait([watcher])
                elif writer is not None:
                    writer.on_disconnect(None)
        except asyncio.CancelledError:
            # Our own cancel, for a client that left: the response is over, not the server.
            if not self._disconnected or task.uncancel() > 0:
                raise
        except OSError:
            pass  # the client left while a frame was being written
        finally:
            await self._close()

    async def stream_response(self, send: Send) -> None:
        if self._writer is None or self._stream is None:
            await super().stream_response(send)
            return
        head = {
            "type": "http.response.start",
            "status": self.status_code,
            "headers": self.raw_headers,
        }
        await send(head)
        await self._stream.run(self._writer)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self, receive: Receive, stream: asyncio.Task[object]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._left(stream)

    def _left(self, stream: asyncio.Task[object]) -> None:
        self._disconnected = True
        stream.cancel()


def _flushing_first(writer: TransportFrameWriter, send: Send) -> Send:
    """`send`, after the live frames the writer still holds: they came first."""

    async def flushed_send(message: Message) -> None:
        writer.flush()
        await send(message)

    return flushed_send


def bearer_token(request: Request, cookie: str) -> str | None:
    """From `Authorization: Bearer …`, else the cookie (browsers' EventSource sends no headers)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(cookie) or None
