"""The operator console: its page and the JSON and SSE endpoints the page reads.

Every route answers 404 unless `EVENT_ROUTER_CONSOLE` is on. The data endpoints need an
admin token (`"admin": true`, with `exp`) when `EVENT_ROUTER_JWT_SECRET` is set, from
`Authorization: Bearer` or the token cookie; the page itself holds no data and loads without
one, so it can ask for a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from typing import Any

import orjson
from dependency_injector.wiring import Provide, inject
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer
from eco_router.application.console_snapshot import ReadConsoleSnapshot
from eco_router.application.dead_letter_listing import DeadLetterFilter, ListDeadLetters
from eco_router.application.errors import Forbidden, TransientError, Unauthorized
from eco_router.application.job_lookup import ListJobControls, LookUpJob
from eco_router.application.port_values import StoredDeadLetter
from eco_router.application.ports import AdminAuthorizer
from eco_router.application.presence import CountJobViewers, JobViewers
from eco_router.application.replay_dead_letters import ReplayDeadLetters, SelectionChanged
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.http.client_streams import ClientStreams, hold_stream
from eco_router.entrypoints.http.public_errors import EpisodeLog
from eco_router.entrypoints.http.sse_responses import (
    ClosingStreamingResponse,
    bearer_token,
)
from eco_router.entrypoints.settings import Settings

log = logging.getLogger(__name__)

# Never in the published API docs: they are public, and this is the operators' API.
router = APIRouter(prefix="/console", tags=["console"], include_in_schema=False)

DLQ_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
FIELD_PREVIEW_CHARS = 300
# How many of a family's oldest dead letters a filter looks through.
SCAN_LIMIT = 1000
# The page is one inline document; nothing may be loaded from elsewhere.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

Config = Depends(Provide[Container.settings])


@inject
async def console_enabled(settings: Settings = Config) -> None:
    _check_enabled(settings)


@inject
async def admin_only(
    request: Request,
    settings: Settings = Config,
    gate: AdminAuthorizer = Depends(Provide[Container.admin_authorizer]),  # noqa: B008
) -> None:
    _check_enabled(settings)
    gate.authorize_admin(bearer_token(request, settings.jwt_cookie))


Enabled = Depends(console_enabled)


def _check_enabled(settings: Settings) -> None:
    if not settings.console:
        raise HTTPException(404, "Not Found")


Admin = Depends(admin_only)


@router.get("", response_class=HTMLResponse, include_in_schema=False, dependencies=[Enabled])
async def console_page() -> HTMLResponse:
    page = resources.files("eco_router.entrypoints.http").joinpath("static", "console.html")
    return HTMLResponse(page.read_text(encoding="utf-8"), headers=PAGE_HEADERS)


@router.get("/api/snapshot", dependencies=[Admin])
@inject
async def snapshot(
    read: ReadConsoleSnapshot = Depends(Provide[Container.console_snapshot]),  # noqa: B008
) -> Response:
    return _json(await read())


@router.get("/api/stream", response_class=StreamingResponse, dependencies=[Admin])
@inject
async def stream(
    request: Request,
    read: ReadConsoleSnapshot = Depends(Provide[Container.console_snapshot]),  # noqa: B008
    settings: Settings = Config,
) -> StreamingResponse:
    closing: asyncio.Event = request.app.state.console_closing
    episodes: EpisodeLog = request.app.state.console_episodes
    # Console streams count toward the same cap per client address as job streams.
    client_streams: ClientStreams = request.app.state.client_streams
    client = hold_stream(request, client_streams)

    async def close() -> None:
        client_streams.release(client)

    frames = _snapshot_frames(read, settings.console_refresh_s, closing, episodes)
    return ClosingStreamingResponse(frames, close=close)


@router.get("/api/dead-letters", dependencies=[Admin])
@inject
async def dead_letters(
    domain: str | None = None,
    reason: str | None = Query(None, max_length=64),
    q: str | None = Query(None, max_length=200, description="text found anywhere in a letter"),
    count: int = Query(100, ge=1, le=1000),
    listing: ListDeadLetters = Depends(Provide[Container.list_dead_letters]),  # noqa: B008
) -> Response:
    with _client_errors():
        found = await listing(
            domain or None,
            matching=DeadLetterFilter(reason or None, q or None),
            count=count,
            scan=SCAN_LIMIT,
        )
    return _json(
        {
            "domains": [
                {
                    "domain": page.domain,
                    "total": page.total,
                    "scanned": page.scanned,
                    "matching": page.matching,
                    "letters": [_letter(page.domain, letter) for letter in page.letters],
                }
                for page in found
            ]
        }
    )


class ReplayRequest(BaseModel):
    """Dead letters to put back: by id, or every one matching the filter."""

    domain: str = Field(max_length=64)
    ids: list[str] | None = Field(None, max_length=SCAN_LIMIT)
    all_matching: bool = False
    reason: str | None = Field(None, max_length=64)
    q: str | None = Field(None, max_length=200)
    expected: int | None = Field(None, ge=0, description="with all_matching: the count confirmed")


@router.post("/api/dead-letters/replay", dependencies=[Admin])
@inject
async def replay_dead_letters(
    body: ReplayRequest,
    replay: ReplayDeadLetters = Depends(Provide[Container.replay_dead_letters]),  # noqa: B008
) -> Response:
    if body.all_matching == (body.ids is not None):
        raise HTTPException(422, "give `ids` or `all_matching: true`, not both and not neither")
    if body.ids is not None and not all(DLQ_ID.fullmatch(i) for i in body.ids):
        raise HTTPException(422, "dead-letter ids are stream entry ids (e.g. 1700000000000-0)")
    with _client_errors():
        if body.ids is not None:
            replayed = await replay(body.domain, ids=body.ids, scan=SCAN_LIMIT)
        else:
            matching = DeadLetterFilter(body.reason or None, body.q or None)
            replayed = await replay(
                body.domain, matching=matching, scan=SCAN_LIMIT, expected=body.expected
            )
    if replayed:
        log.info("console: replayed %d dead letters of %s", len(replayed), body.domain)
    return _json({"replayed": replayed})


@router.get("/api/jobs/{domain}/{job_id}", dependencies=[Admin])
@inject
async def job(
    domain: str,
    job_id: str,
    look_up: LookUpJob = Depends(Provide[Container.look_up_job]),  # noqa: B008
    count_viewers: CountJobViewers = Depends(Provide[Container.count_job_viewers]),  # noqa: B008
    list_controls: ListJobControls = Depends(Provide[Container.list_job_controls]),  # noqa: B008
) -> Response:
    with _client_errors():
        view = await look_up(domain, job_id)
        controls = await list_controls(domain, job_id)
    if view.state is None and not view.history:
        raise HTTPException(404, f"no state for {domain} job {job_id!r} (unknown or expired)")
    try:
        viewers: JobViewers | None = await count_viewers(domain, job_id)
    except TransientError as error:
        # The job's state is worth showing without its viewers: they read "unknown".
        log.warning("console: viewer counts of %s unreadable: %s", job_id, error)
        viewers = None
    return _json(
        {
            "domain": domain,
            "job_id": job_id,
            "state": _payload(view.state) if view.state is not None else None,
            "history": [_payload(p) for p in view.history],
            "viewers": None
            if viewers is None
            else {"total": viewers.total, "by_gateway": viewers.by_gateway},
            "controls": [
                {
                    "number": m.number,
                    "kind": m.kind.value,
                    "state": m.state.value,
                    "deliveries": m.deliveries,
                    "request_id": m.request_id,
                    "message_id": m.message_id,
                    "bytes": m.size,
                    "preview": m.preview,
                }
                for m in controls.messages
            ],
            "control_totals": {
                "messages": controls.total,
                "waiting": controls.waiting,
                "waiting_bytes": controls.waiting_bytes,
            },
        }
    )


class SessionRequest(BaseModel):
    """An admin token to keep in the token cookie, for the page's EventSource."""

    token: str = Field(min_length=1, max_length=4096)


@router.get("/api/session", dependencies=[Enabled])
@inject
async def session(
    request: Request,
    settings: Settings = Config,
    gate: AdminAuthorizer = Depends(Provide[Container.admin_authorizer]),  # noqa: B008
) -> Response:
    """Whether this request's credentials open the console, always answered 200: the page asks
    on load, and a visitor who has not signed in yet is expected, not an error."""
    token = bearer_token(request, settings.jwt_cookie)
    try:
        gate.authorize_admin(token)
    except (Unauthorized, Forbidden) as error:
        # No token is the first visit (nothing to say); a refused one is a session that ended.
        detail = str(error) if token else None
        return _json({"signed_in": False, "detail": detail, "token_required": True})
    required = isinstance(gate, JwtAdminAuthorizer)
    return _json({"signed_in": True, "detail": None, "token_required": required})


@router.post("/api/session", status_code=204, dependencies=[Enabled])
@inject
async def open_session(
    body: SessionRequest,
    settings: Settings = Config,
    gate: AdminAuthorizer = Depends(Provide[Container.admin_authorizer]),  # noqa: B008
) -> Response:
    response = Response(status_code=204)
    if isinstance(gate, JwtAdminAuthorizer):
        expires = gate.expiry(body.token)
        response.set_cookie(
            settings.jwt_cookie,
            body.token,
            max_age=max(expires - int(time.time()), 0),
            httponly=True,
            samesite="strict",
        )
    return response


@router.delete("/api/session", status_code=204, dependencies=[Enabled])
@inject
async def close_session(settings: Settings = Config) -> Response:
    response = Response(status_code=204)
    response.delete_cookie(settings.jwt_cookie, httponly=True, samesite="strict")
    return response


def install(app: FastAPI, container: Container) -> None:
    """Serve the console routes on `app` (404 unless the console is on)."""
    container.wire(modules=[__name__])
    app.include_router(router)
    app.state.console_closing = asyncio.Event()
    app.state.console_episodes = EpisodeLog()
    settings: Settings = container.settings()
    if settings.console and settings.jwt_secret is None:
        log.warning(
            "EVENT_ROUTER_CONSOLE is on and EVENT_ROUTER_JWT_SECRET is not set: the operator "
            "console at /console, dead-letter replay included, is open to everyone"
        )


def end_streams(app: FastAPI) -> None:
    """Shutting down: end the console's open streams now (the page reconnects elsewhere)."""
    closing: asyncio.Event | None = getattr(app.state, "console_closing", None)
    if closing is not None:
        closing.set()


async def _snapshot_frames(
    read: ReadConsoleSnapshot, refresh_s: float, closing: asyncio.Event, episodes: EpisodeLog
) -> AsyncIterator[bytes]:
    yield f"retry: {int(refresh_s * 1000)}\n\n".encode()
    while not closing.is_set():
        try:
            frame = b"event: snapshot\ndata: " + orjson.dumps(await read()) + b"\n\n"
        except Exception as error:
            # The page says so and keeps the last figures; the next tick tries again. The
            # cause (addresses, driver text) goes to the log only.
            episodes.failed("redis (console)", error)
            frame = b'event: unavailable\ndata: {"detail":"redis unavailable, retry later"}\n\n'
        yield frame
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), refresh_s)


@contextlib.contextmanager
def _client_errors() -> Iterator[None]:
    """What the use cases refuse, as the client's mistake: unknown → 404, invalid → 422, a
    selection that changed since it was confirmed → 409."""
    try:
        yield
    except SelectionChanged as error:
        raise HTTPException(409, str(error)) from error
    except LookupError as error:
        raise HTTPException(404, str(error)) from error
    except ValueError as error:
        raise HTTPException(422, str(error)) from error


def _letter(domain: str, letter: StoredDeadLetter) -> dict[str, Any]:
    job_id = letter.fields.get(b"job_id")
    return {
        "domain": domain,
        "dlq_id": letter.dlq_id,
        "stream": letter.stream,
        "entry_id": letter.entry_id,
        "reason": letter.reason,
        "detail": letter.detail,
        "deliveries": letter.deliveries,
        "dead_at_ms": letter.dead_at_ms,
        "job_id": _preview(job_id) if job_id is not None else None,
        "fields": {_preview(k): _preview(v) for k, v in letter.fields.items()},
    }


def _preview(value: bytes) -> str:
    text = value.decode(errors="replace")
    if len(text) <= FIELD_PREVIEW_CHARS:
        return text
    return f"{text[:FIELD_PREVIEW_CHARS]}… ({len(value)} bytes)"


def _payload(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode(errors="replace")


def _json(value: Any) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")
