"""The HTTP application factory, its lifespan and its error table."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from eco_router import __version__
from eco_router.adapters.redaction import hide_access_log_tokens
from eco_router.application.errors import Forbidden, PortError, TransientError, Unauthorized
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.gc_tuning import settle_garbage_collector
from eco_router.entrypoints.http import console_routes, ops_routes, sse_routes
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.runner import RouterRunner

log = logging.getLogger(__name__)

# The one place port errors become HTTP statuses.
ERROR_STATUS: dict[type[PortError], int] = {
    Unauthorized: 401,
    Forbidden: 403,
    TransientError: 503,
}


def create_app(
    container: Container, *, owns_lifecycle: bool = True, route: bool = True, demo: bool = False
) -> FastAPI:
    """The app; when it `owns_lifecycle`, its lifespan opens the connections and, with
    `route`, runs the router (the worker opens them and routes on its own).

    `demo` enables `POST /api/v1/demo/jobs`, which the page at `/` uses to start a job.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not owns_lifecycle:
            yield
            return
        if container.settings().jwt_secret is None:
            log.warning(
                "EVENT_ROUTER_JWT_SECRET is not set: every job's events are open to everyone"
            )
        async with RouterRunner(container, route=route) as runner:
            app.state.runner = runner
            settle_garbage_collector()
            try:
                yield
            finally:
                demo_jobs = await resolve(container.start_demo_job())
                await demo_jobs.aclose()

    hide_access_log_tokens()
    app = FastAPI(title="eco-router", version=__version__, lifespan=lifespan)
    app.state.container = container
    app.state.demo = demo
    container.wire(modules=[ops_routes, sse_routes])
    app.include_router(ops_routes.router)
    app.include_router(sse_routes.router)
    if owns_lifecycle:
        # `serve` only: the worker's port is for probes and metrics.
        console_routes.install(app, container)

    @app.exception_handler(PortError)
    async def port_error(request: Request, error: PortError) -> JSONResponse:
        status = next((s for t, s in ERROR_STATUS.items() if isinstance(error, t)), 500)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse({"detail": str(error)}, status_code=status, headers=headers)

    return app


async def end_streams(app: FastAPI) -> None:
    """Shutting down: end every open SSE stream now; clients resume on another process.

    Streams do not end by themselves, so the server would otherwise wait out its graceful
    shutdown timeout and then cut them.
    """
    console_routes.end_streams(app)
    container: Container = app.state.container
    if container.event_feed.initialized:
        feed = await resolve(container.event_feed())
        feed.close_viewers()
