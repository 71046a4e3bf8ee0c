"""The HTTP application factory, its lifespan and its error table."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from eco_router import __version__
from eco_router.adapters.redaction import hide_access_log_tokens
from eco_router.application.demo_jobs import StartDemoJob
from eco_router.application.errors import (
    ControlExhausted,
    ControlLimited,
    Forbidden,
    JobEnded,
    PortError,
    RequestIdConflict,
    TransientError,
    Unauthorized,
    UnknownJob,
)
from eco_router.application.ports import EventFeed
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.gateway_tasks import GatewayTasks
from eco_router.entrypoints.gc_tuning import settle_garbage_collector
from eco_router.entrypoints.http import (
    asset_routes,
    console_routes,
    control_routes,
    favicon_routes,
    ops_routes,
    sse_routes,
    ui_message_routes,
)
from eco_router.entrypoints.http.client_streams import RETRY_AFTER_S, ClientStreams
from eco_router.entrypoints.http.cors import JobEventsCors
from eco_router.entrypoints.http.demo_throttle import DemoJobThrottle, Throttle
from eco_router.entrypoints.http.public_errors import EpisodeLog, public_reason, service_of
from eco_router.entrypoints.http.sse_fast_path import JobEventsFastPath
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.runner import RouterRunner

log = logging.getLogger(__name__)

# Demo jobs a process starts: 2 a second (bursts of 20), and one client 1 every 2 s (bursts of 5).
DEMO_JOBS_PER_S, DEMO_JOBS_BURST = 2.0, 20
DEMO_JOBS_PER_CLIENT_S, DEMO_JOBS_PER_CLIENT_BURST = 0.5, 5

# The one place port errors become HTTP statuses.
ERROR_STATUS: dict[type[PortError], int] = {
    Unauthorized: 401,
    Forbidden: 403,
    UnknownJob: 404,
    JobEnded: 409,
    ControlExhausted: 409,
    RequestIdConflict: 422,
    ControlLimited: 429,
    TransientError: 503,
}
ERROR_HEADERS: dict[int, dict[str, str]] = {
    401: {"WWW-Authenticate": "Bearer"},
    503: {"Retry-After": str(RETRY_AFTER_S)},
}


def create_app(container: Container, *, route: bool = True, demo: bool = False) -> FastAPI:
    """The gateway (`eco-router serve`): its lifespan opens the connections and, with `route`,
    runs the router.

    `demo` enables `POST /api/v1/demo/jobs` (throttled), which the page at `/` uses to start a
    job. `/metrics` is served only with `EVENT_ROUTER_GATEWAY_METRICS`, the API docs
    (`/docs`, `/redoc`, `/openapi.json`) only with `EVENT_ROUTER_API_DOCS`.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if container.settings().jwt_secret is None:
            log.warning(
                "EVENT_ROUTER_JWT_SECRET is not set: every job's events are open to everyone"
            )
        # The gateway's tasks end before the runner closes the connections they post on.
        async with RouterRunner(container, route=route) as runner, GatewayTasks(container):
            app.state.runner = runner
            # Kept for `end_streams`, whichever adapter serves the feed: the Redis one is a
            # Resource the runner has opened, the in-memory one a plain singleton.
            app.state.event_feed = await resolve(container.event_feed())
            app.state.demo_jobs = demo_jobs = await resolve(container.start_demo_job())
            settle_garbage_collector()
            try:
                yield
            finally:
                await demo_jobs.aclose()

    hide_access_log_tokens()
    docs = container.settings().api_docs
    app = FastAPI(
        title="eco-router",
        version=__version__,
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.container = container
    app.state.demo = demo
    app.state.client_streams = ClientStreams(container.settings().sse_max_per_client)
    container.wire(modules=[ops_routes, sse_routes])
    app.include_router(ops_routes.public_router)
    if container.settings().gateway_metrics:
        app.include_router(ops_routes.metrics_router)
    app.include_router(sse_routes.router)
    app.include_router(control_routes.router)
    app.include_router(ui_message_routes.router)
    console_routes.install(app, container)
    app.include_router(favicon_routes.router)
    app.include_router(asset_routes.router)
    # Added first, so it runs inside every other middleware added below (CORS among them).
    app.add_middleware(JobEventsFastPath)
    if demo:
        throttle = Throttle(
            rate=DEMO_JOBS_PER_S,
            burst=DEMO_JOBS_BURST,
            client_rate=DEMO_JOBS_PER_CLIENT_S,
            client_burst=DEMO_JOBS_PER_CLIENT_BURST,
        )
        app.add_middleware(DemoJobThrottle, throttle=throttle)
    if container.settings().cors_origins:
        app.add_middleware(JobEventsCors, origins=container.settings().cors_origins)

    episodes = EpisodeLog()

    @app.exception_handler(PortError)
    async def port_error(request: Request, error: PortError) -> JSONResponse:
        status = next((s for t, s in ERROR_STATUS.items() if isinstance(error, t)), 500)
        headers = ERROR_HEADERS.get(status)
        if isinstance(error, ControlLimited):
            headers = {"Retry-After": str(error.retry_after_s)}
        detail = str(error)
        if status >= 500:
            # An adapter's text names internal addresses: the client gets a generic line.
            episodes.failed(service_of(error), error)
            detail = public_reason(error)
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    return app


def create_ops_app(container: Container) -> FastAPI:
    """The worker's port: `/health`, `/ready` and `/metrics` only, no job data and no page.

    The worker opens the connections and routes on its own, so this app has no lifespan.
    """
    app = FastAPI(
        title="eco-router worker",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    container.wire(modules=[ops_routes])
    app.include_router(ops_routes.router)
    app.include_router(ops_routes.metrics_router)
    return app


async def end_streams(app: FastAPI) -> None:
    """Shutting down: stop the demo jobs, then end every open SSE stream now; clients resume
    on another process.

    Streams do not end by themselves, so the server would otherwise wait out its graceful
    shutdown timeout and then cut them. The demo jobs are stopped (cancelled and awaited)
    first, so that none of their events races a stream's end.
    """
    demo_jobs: StartDemoJob | None = getattr(app.state, "demo_jobs", None)
    if demo_jobs is not None:
        await demo_jobs.aclose()
    console_routes.end_streams(app)
    feed: EventFeed | None = getattr(app.state, "event_feed", None)
    if feed is not None:
        feed.close_viewers()
