"""A job's answer as the AI SDK's UI message stream (docs/AI_SDK.md): `useChat` reads it.

The job's own SSE stream (`StreamJobEvents`: its authorization, bounds, replay and metrics)
is opened as for `/events`, and each frame it writes is mapped to UI parts
(`domain/ui_message_stream.py`). The path is the one `DefaultChatTransport` reconnects to,
`${api}/${chatId}/stream`, with `api` = `/api/v1/{domain}`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from eco_router.application.frame_buffer import FrameBuffer
from eco_router.application.ports import FrameWriter
from eco_router.application.stream_job_events import JobStream, StreamJobEvents
from eco_router.domain.sse import Frame
from eco_router.domain.ui_message_stream import (
    DONE_LINE,
    HEADER_NAME,
    HEADER_VALUE,
    Part,
    UiText,
    encode,
    opening,
    ui_parts,
)
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.http.sse_responses import (
    JOB_ID,
    MAX_SEQ,
    bearer_token,
    streaming_response,
)
from eco_router.entrypoints.resolve import resolve

router = APIRouter()
RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"description": "The job's answer as UI message stream parts (text/event-stream)."}
}
RAW_HEADER = (HEADER_NAME.encode(), HEADER_VALUE.encode())


@router.get(
    "/api/v1/{domain}/{job_id}/stream",
    response_class=StreamingResponse,
    responses={
        **RESPONSES,
        204: {"description": "The job has ended (or is idle): no answer is streaming."},
    },
)
async def resume_answer(request: Request, domain: str, job_id: str) -> Response:
    """`useChat`'s reconnect (`resume: true`): the whole text so far in one delta, then live
    deltas; 204 when the job's answer is no longer streaming."""
    return await answer_stream(request, domain, job_id, resume=True)


@router.post("/api/v1/{domain}/{job_id}/stream", response_class=StreamingResponse)
async def send_answer(request: Request, domain: str, job_id: str) -> Response:
    """`useChat`'s send (its body is not read): the answer from the start, even when the
    job has ended already."""
    return await answer_stream(request, domain, job_id, resume=False)


async def answer_stream(request: Request, domain: str, job_id: str, *, resume: bool) -> Response:
    """Validate and authorize as the job's event stream does, then stream its UI parts."""
    container: Container = request.app.state.container
    settings = container.settings()
    if JOB_ID.fullmatch(job_id) is None:
        raise HTTPException(422, "job_id must be 1-128 characters of [A-Za-z0-9_.:-]")
    if domain not in settings.domains:
        raise HTTPException(404, f"unknown domain {domain!r}; known: {', '.join(settings.domains)}")
    authorizer = await resolve(container.authorizer())
    authorizer.authorize(bearer_token(request, settings.jwt_cookie), job_id, domain=domain)
    stream: StreamJobEvents = await resolve(container.stream_job_events())
    # Ended at any id: the job's end (or its latest event, idle) is stored.
    if resume and await stream.already_ended(domain, job_id, MAX_SEQ):
        return Response(status_code=204)

    async def open_stream() -> UiMessageStream:
        return UiMessageStream(job_id, await stream.open(domain, job_id))

    response = await streaming_response(request, request.app.state.client_streams, open_stream)
    response.raw_headers.append(RAW_HEADER)
    return response


class UiMessageStream:
    """A job's stream told as UI parts: `start`, the text's parts, then `finish` (or `error`)
    and `[DONE]` at the job's end. The job's stream writes through `UiMessageWriter`, so its
    frames take the one path every stream's do, live ones straight from the feed's fan-out."""

    __slots__ = ("_chunks", "_job_id", "_stream")

    def __init__(self, job_id: str, stream: JobStream) -> None:
        self._job_id = job_id
        self._stream = stream
        self._chunks: AsyncGenerator[bytes] | None = None

    async def run(self, writer: FrameWriter) -> None:
        # Run to the job stream's own end, which comes right after the job's: it then counts
        # the stream closed for the job's reason (`done`, `failed`), not as a disconnect.
        await self._stream.run(UiMessageWriter(self._job_id, writer))

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._chunks = FrameBuffer().chunks(self.run)
        return self._chunks

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()
        await self._stream.aclose()


class UiMessageWriter(FrameWriter):
    """The connection as a job's stream told as UI parts sees it: each frame is mapped to its
    parts (`ui_parts`) as it is written; the first write starts the message."""

    __slots__ = ("_job_id", "_state", "_writer")

    def __init__(self, job_id: str, writer: FrameWriter) -> None:
        self._job_id = job_id
        self._writer = writer
        self._state: UiText | None = None

    def writable(self) -> bool:
        return self._writer.writable()

    async def drained(self) -> None:
        await self._writer.drained()

    def write(self, frame: Frame) -> None:
        self.write_all([frame])

    def write_all(self, frames: Sequence[Frame]) -> None:
        out: list[Part] = []
        state = self._state
        if state is None:
            out += opening(self._job_id)
            state = UiText()
        ended = state.ended
        for frame in frames:
            parts, state = ui_parts(frame, state)
            out += parts
        self._state = state
        data = encode(out) + (DONE_LINE if state.ended and not ended else b"")
        if data:
            self._writer.write_all([Frame(None, "ui", b"", data)])

    def keep_alive(self, every_s: float) -> None:
        self._writer.keep_alive(every_s)

    def stop_keepalive(self) -> None:
        self._writer.stop_keepalive()
