"""The job-events stream served ahead of FastAPI's routing: the request every browser opens."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from eco_router.entrypoints.http.sse_routes import open_job_events

# The path of `sse_routes.job_events`, as Starlette matches `{domain}` and `{job_id}`.
JOB_EVENTS_PATH = re.compile(r"/api/v1/(?P<domain>[^/]+)/(?P<job_id>[^/]+)/events")

ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


class JobEventsFastPath:
    """Serves `GET /api/v1/{domain}/{job_id}/events` itself and passes every other request on.

    The route stays declared in `sse_routes` (its documentation, and the same function), but
    reaching it through FastAPI costs each of thousands of connections its routing, its
    dependency solving and validation, and a dozen more coroutine frames kept for the life of
    the stream. Its parameters are strings with no other rule (`job_event_stream` checks
    them), and errors go to the app's own exception handlers, so the answers are the same.
    Installed inside the app's user middlewares (CORS still applies) and outside its exception
    middleware, which is why it calls the handlers itself.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        found = JOB_EVENTS_PATH.fullmatch(scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        response = await _respond(scope, receive, found["domain"], found["job_id"])
        await response(scope, receive, send)


async def _respond(scope: Scope, receive: Receive, domain: str, job_id: str) -> Response:
    """The stream's response, or the error's. Made here so that the request and what it
    parsed (headers, query, cookies) are not kept for the life of the stream."""
    request = Request(scope, receive)
    try:
        last_event_id = request.query_params.get("last_event_id")
        return await open_job_events(request, domain, job_id, last_event_id)
    except Exception as error:
        handler = _handler_for(request.app.exception_handlers, error)
        if handler is None:
            raise
        return await handler(request, error)


def _handler_for(
    handlers: Mapping[Any, ExceptionHandler], error: Exception
) -> ExceptionHandler | None:
    """The handler registered for the closest class of `error`, as Starlette looks it up."""
    for kind in type(error).__mro__:
        if kind in handlers:
            return handlers[kind]
    return None
