"""The SSE gateway's routes and the demo page."""

from __future__ import annotations

from importlib import resources

from dependency_injector.wiring import Provide, inject
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from eco_router.adapters.jwt_authorizer import JwtAuthorizer
from eco_router.application.demo_jobs import StartDemoJob
from eco_router.application.ports import Authorizer
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.http.demo_throttle import MAX_DEMO_JOBS_PER_REQUEST
from eco_router.entrypoints.http.many_job_streams import many_jobs_stream
from eco_router.entrypoints.http.sse_responses import job_event_stream
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.settings import Settings

router = APIRouter()
DEMO_TOKEN_TTL_S = 3600
ENDED_ALREADY: dict[int | str, dict[str, object]] = {
    204: {"description": "The Last-Event-ID already reaches the job's end: stop reconnecting."}
}


async def open_job_events(
    request: Request, domain: str, job_id: str, last_event_id: str | None
) -> Response:
    """A job's event stream, its ports resolved from the app's container in this coroutine:
    FastAPI would run a synchronous dependency (such as a `Provide` marker) in a worker thread,
    a thread hop per dependency on every connection. Also what `JobEventsFastPath` serves."""
    container: Container = request.app.state.container
    settings = container.settings()
    return await job_event_stream(
        request,
        domain=domain,
        job_id=job_id,
        last_event_id=last_event_id,
        domains=settings.domains,
        cookie=settings.jwt_cookie,
        authorizer=await resolve(container.authorizer()),
        stream=await resolve(container.stream_job_events()),
        client_streams=request.app.state.client_streams,
    )


DemoAuth = Depends(Provide[Container.authorizer])
DemoConfig = Depends(Provide[Container.settings])


@router.get(
    "/api/v1/{domain}/{job_id}/events", response_class=StreamingResponse, responses=ENDED_ALREADY
)
async def job_events(
    request: Request, domain: str, job_id: str, last_event_id: str | None = None
) -> Response:
    return await open_job_events(request, domain, job_id, last_event_id)


@router.get("/api/v1/stream", response_class=StreamingResponse, responses=ENDED_ALREADY)
async def legacy_job_events(
    request: Request,
    job_id: str = Query(..., description="the job to watch (domain scan)"),
    last_event_id: str | None = None,
) -> Response:
    return await open_job_events(request, "scan", job_id, last_event_id)


@router.get(
    "/api/v1/streams",
    response_class=StreamingResponse,
    responses={204: {"description": "Every job has ended at the Last-Event-ID."}},
)
async def many_job_events(
    request: Request,
    job: list[str] = Query(  # noqa: B008
        default=[], description="domain:job_id, repeatable; none: the token's jobs"
    ),
    last_event_id: str | None = None,
) -> Response:
    """Many jobs' events on one stream ([SSE.md](docs/SSE.md#many-jobs-on-one-stream))."""
    container: Container = request.app.state.container
    settings = container.settings()
    return await many_jobs_stream(
        request,
        named=job,
        last_event_id=last_event_id,
        domains=settings.domains,
        max_jobs=settings.sse_max_jobs_per_stream,
        cookie=settings.jwt_cookie,
        authorizer=await resolve(container.authorizer()),
        admin_authorizer=await resolve(container.admin_authorizer()),
        stream=await resolve(container.stream_many_jobs()),
        client_streams=request.app.state.client_streams,
    )


@router.post("/api/v1/demo/jobs", status_code=201)
@inject
async def start_demo_job(
    request: Request,
    response: Response,
    fail: bool = False,
    chat: bool = False,
    ask: bool = False,
    count: int = Query(1, ge=1, le=MAX_DEMO_JOBS_PER_REQUEST),
    start: StartDemoJob = Depends(Provide[Container.start_demo_job]),  # noqa: B008
    authorizer: Authorizer = DemoAuth,
    settings: Settings = DemoConfig,
) -> dict[str, object]:
    """`count` demo jobs (a dashboard's: their events on one stream, `stream`); the first
    one's `job_id` and `events` for a page watching one."""
    if not request.app.state.demo:
        raise HTTPException(404, "demo jobs are off (start the app with --demo)")
    job_ids = [await start(fail=fail, chat=chat, ask=ask) for _ in range(count)]
    container: Container = request.app.state.container
    family = container.chat_producer_config().family if chat else settings.streams[0]
    domain = family.domain
    if isinstance(authorizer, JwtAuthorizer):
        # The page's EventSource sends cookies, not headers: give it a token for these jobs.
        token = authorizer.issue(domain, job_ids, ttl_s=DEMO_TOKEN_TTL_S)
        response.set_cookie(
            settings.jwt_cookie, token, max_age=DEMO_TOKEN_TTL_S, httponly=True, samesite="strict"
        )
    job_id = job_ids[0]
    return {
        "job_id": job_id,
        "domain": domain,
        "events": f"/api/v1/{domain}/{job_id}/events",
        "jobs": job_ids,
        "stream": "/api/v1/streams?" + "&".join(f"job={domain}:{j}" for j in job_ids),
    }


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def demo_page() -> HTMLResponse:
    return _static_page("index.html")


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard_page() -> HTMLResponse:
    """Many jobs over one connection (`/dashboard?job=scan:J1&job=scan:J2`, or demo jobs)."""
    return _static_page("dashboard.html")


def _static_page(name: str) -> HTMLResponse:
    page = resources.files("eco_router.entrypoints.http").joinpath("static", name)
    return HTMLResponse(page.read_text(encoding="utf-8"))
