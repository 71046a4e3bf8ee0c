"""Turning an SSE request into a streaming response: job id, resume point, token, errors."""

from __future__ import annotations

import re

from fastapi import HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from eco_router.application.ports import Authorizer
from eco_router.application.stream_job_events import StreamJobEvents

JOB_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


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
) -> Response:
    """Validate everything before the first byte; then stream the job's frames.

    A resuming client that already has the job's end gets 204 No Content: by the SSE
    standard, a browser's EventSource then stops reconnecting.
    """
    if JOB_ID.fullmatch(job_id) is None:
        raise HTTPException(422, "job_id must be 1-128 characters of [A-Za-z0-9_.:-]")
    if domain not in domains:
        raise HTTPException(404, f"unknown domain {domain!r}; known: {', '.join(domains)}")
    resume = request.headers.get("last-event-id") or last_event_id
    after: int | None = None
    if resume:
        if not resume.isascii() or not resume.isdigit():
            raise HTTPException(422, "Last-Event-ID must be a non-negative integer (a seq)")
        after = int(resume)
    authorizer.authorize(bearer_token(request, cookie), job_id, domain=domain)
    if await stream.already_ended(domain, job_id, after):
        return Response(status_code=204)
    return StreamingResponse(
        stream(domain, job_id, after), media_type="text/event-stream", headers=SSE_HEADERS
    )


def bearer_token(request: Request, cookie: str) -> str | None:
    """From `Authorization: Bearer …`, else the cookie (browsers' EventSource sends no headers)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(cookie) or None
