"""The control routes: a job's viewers cancel it or answer it (docs/CONTROL.md)."""

from __future__ import annotations

import hashlib
import secrets

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from eco_router.application.errors import Forbidden, Unauthorized
from eco_router.domain.control import (
    ANONYMOUS,
    MAX_CONTROL_BODY_BYTES,
    ControlKind,
    ControlReceipt,
    InvalidControl,
    Recorded,
    control_request,
)
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.http.sse_responses import JOB_ID, bearer_token
from eco_router.entrypoints.resolve import resolve

router = APIRouter()
IDEMPOTENCY_HEADER = "idempotency-key"
# The reference design's chat API answers its user at `/chat/{job}/input`.
REFERENCE_DOMAIN = "chat"
CONTROL_RESPONSES: dict[int | str, dict[str, object]] = {
    202: {
        "description": "Recorded durably (or recorded before under this request id, or for a "
        "cancel, the job's first cancel)."
    },
    404: {"description": "The job has no event yet (unknown, or expired)."},
    409: {"description": "The job has already ended, or has had all the messages it may."},
    413: {"description": f"The body is larger than {MAX_CONTROL_BODY_BYTES} bytes."},
    415: {"description": "A body sent without Content-Type: application/json."},
    422: {
        "description": "The body or the request id is not valid, or the request id was used "
        "for the other kind."
    },
    429: {
        "description": "Too many messages wait for the worker, or too many were sent: "
        "retry after Retry-After seconds."
    },
}


@router.post("/api/v1/{domain}/{job_id}/cancel", status_code=202, responses=CONTROL_RESPONSES)
async def cancel_job(request: Request, domain: str, job_id: str) -> JSONResponse:
    return await send(request, domain, job_id, ControlKind.CANCEL)


@router.post("/api/v1/{domain}/{job_id}/input", status_code=202, responses=CONTROL_RESPONSES)
async def answer_job(request: Request, domain: str, job_id: str) -> JSONResponse:
    return await send(request, domain, job_id, ControlKind.INPUT)


@router.post("/chat/{job_id}/input", status_code=202, responses=CONTROL_RESPONSES)
async def answer_reference_chat(request: Request, job_id: str) -> JSONResponse:
    """The reference design's call: a request without a request id gets one of its own (it
    is recorded once per call, as the reference's PUBLISH was sent once)."""
    return await send(
        request, REFERENCE_DOMAIN, job_id, ControlKind.INPUT, default_id=secrets.token_hex(16)
    )


async def send(
    request: Request,
    domain: str,
    job_id: str,
    kind: ControlKind,
    *,
    default_id: str | None = None,
) -> JSONResponse:
    """Validate, authorize as the job's event stream is (a viewer's token for the job, or an
    admin's), record, and answer 202 with the receipt (the same for a repeated request id)."""
    container: Container = request.app.state.container
    settings = container.settings()
    if JOB_ID.fullmatch(job_id) is None:
        raise HTTPException(422, "job_id must be 1-128 characters of [A-Za-z0-9_.:-]")
    if domain not in settings.domains:
        raise HTTPException(404, f"unknown domain {domain!r}; known: {', '.join(settings.domains)}")
    token = bearer_token(request, settings.jwt_cookie)
    try:
        (await resolve(container.authorizer())).authorize(token, job_id, domain=domain)
    except (Unauthorized, Forbidden) as refused:
        try:
            (await resolve(container.admin_authorizer())).authorize_admin(token)
        except (Unauthorized, Forbidden):
            raise refused from None
    raw = await request.body()
    # A JSON content type cannot be sent across sites without a CORS preflight: a form on
    # another site cannot post a cancel or an input with a viewer's cookie.
    if raw.strip() and not _is_json(request.headers.get("content-type", "")):
        raise HTTPException(415, "the body must be sent as Content-Type: application/json")
    if len(raw) > MAX_CONTROL_BODY_BYTES:
        raise HTTPException(413, f"the body has {len(raw)} bytes (max {MAX_CONTROL_BODY_BYTES})")
    key = request.headers.get(IDEMPOTENCY_HEADER)
    try:
        parsed = control_request(
            domain, job_id, kind, raw, key, default_id=default_id, sender=sender_of(token)
        )
    except InvalidControl as error:
        raise HTTPException(422, str(error)) from None
    receipt = await (await resolve(container.send_control()))(parsed)
    headers = {"Idempotent-Replayed": "true"} if receipt.outcome is Recorded.DUPLICATE else None
    return JSONResponse(answer(receipt, domain, job_id), status_code=202, headers=headers)


def sender_of(token: str | None) -> str:
    """The namespace of a sender's request ids: derived from its credential (a digest, so
    neither the token nor its size reaches the store); one for all without a token."""
    if not token:
        return ANONYMOUS
    return "t" + hashlib.sha256(token.encode()).hexdigest()[:32]


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == "application/json"


def answer(receipt: ControlReceipt, domain: str, job_id: str) -> dict[str, object]:
    """The 202's body: what was recorded, and where its announcement shows."""
    return {
        "request_id": receipt.request_id,
        "message_id": receipt.message_id,
        "number": receipt.number,
        "kind": None if receipt.kind is None else receipt.kind.value,
        "job_id": job_id,
        "events": f"/api/v1/{domain}/{job_id}/events",
    }
