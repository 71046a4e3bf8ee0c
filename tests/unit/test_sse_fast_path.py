"""The job-events stream served ahead of FastAPI's routing answers as the declared route does;
on the in-memory adapters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from eco_router.adapters.jwt_authorizer import JwtAuthorizer
from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.http.sse_fast_path import JobEventsFastPath
from eco_router.entrypoints.settings import load_settings
from tests.environment import clear_settings

SECRET = "a-test-secret-that-is-long-enough-for-hs256"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


def client_of(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 40_000))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.test")


def without_fast_path(app: FastAPI) -> FastAPI:
    """The same app, its requests routed by FastAPI only."""
    app.user_middleware = [m for m in app.user_middleware if m.cls is not JobEventsFastPath]
    app.middleware_stack = None
    return app


async def started(fast: bool) -> AsyncIterator[FastAPI]:
    settings = load_settings(jwt_secret=SECRET, cors_origins="https://app.example.com")
    container = build_container(settings, in_memory=True)
    app = create_app(container)
    if not fast:
        without_fast_path(app)
    async with LifespanManager(app):
        yield app
    container.unwire()


@pytest.fixture(params=[True, False], ids=["fast path", "FastAPI route"])
async def gateway(request: pytest.FixtureRequest) -> AsyncIterator[FastAPI]:
    async for app in started(request.param):
        yield app


def token(app: FastAPI, job_id: str) -> str:
    authorizer = app.state.container.authorizer()
    assert isinstance(authorizer, JwtAuthorizer)
    return authorizer.issue("scan", [job_id], ttl_s=60)


REFUSED = [
    ("/api/v1/scan/job%20one/events", {}),  # a job id outside the alphabet
    ("/api/v1/chat/job-1/events", {}),  # a domain no family has
    ("/api/v1/scan/job-1/events?last_event_id=-1", {}),
    ("/api/v1/scan/job-1/events", {"Last-Event-ID": "x" * 30}),
    ("/api/v1/scan/job-1/events", {}),  # no token
    ("/api/v1/scan/job-1/events", {"Authorization": "Bearer not-a-token"}),
]


@pytest.mark.parametrize(("path", "headers"), REFUSED)
async def test_a_refused_stream_gets_the_routes_answer(path: str, headers: dict[str, str]) -> None:
    answers = []
    for fast in (True, False):
        async for app in started(fast):
            async with client_of(app) as client:
                answer = await client.get(
                    path, headers={"Origin": "https://app.example.com", **headers}
                )
            answers.append(
                (
                    answer.status_code,
                    answer.json(),
                    {k: v for k, v in answer.headers.items() if k != "content-length"},
                )
            )

    fast_answer, route_answer = answers
    assert fast_answer == route_answer
    assert fast_answer[0] in (401, 403, 404, 422)


async def test_another_jobs_token_is_forbidden(gateway: FastAPI) -> None:
    async with client_of(gateway) as client:
        answer = await client.get(
            "/api/v1/scan/job-1/events",
            headers={"Authorization": f"Bearer {token(gateway, 'job-2')}"},
        )

    assert answer.status_code == 403


async def test_the_stream_is_served_without_reaching_the_route() -> None:
    async for app in started(True):
        route = "/api/v1/{domain}/{job_id}/events"
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != route]
        headers = {
            "authorization": f"Bearer {token(app, 'job-1')}",
            "origin": "https://app.example.com",
        }
        start, first = await first_frame(app, "/api/v1/scan/job-1/events", headers)

        sent = {k.decode(): v.decode() for k, v in start["headers"]}
        assert start["status"] == 200
        assert sent["content-type"].startswith("text/event-stream")
        assert sent["access-control-allow-origin"] == "https://app.example.com"
        assert first.startswith(b"event: snapshot")


async def first_frame(
    app: FastAPI, path: str, headers: dict[str, str]
) -> tuple[dict[str, Any], bytes]:
    """The response's start and first body chunk; then the client leaves (a stream does not
    end by itself, and httpx's ASGI transport waits for the end)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("192.0.2.1", 40_000),
        "server": ("gateway.test", 80),
    }
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    left = asyncio.Event()
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if asked:
            await left.wait()
            return {"type": "http.disconnect"}
        asked = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        await messages.put(message)

    served = asyncio.create_task(app(scope, receive, send))
    try:
        start = await asyncio.wait_for(messages.get(), 5)
        body = await asyncio.wait_for(messages.get(), 5)
    finally:
        left.set()
        await asyncio.wait_for(served, 5)
    return start, body["body"]


async def test_other_requests_pass_through(gateway: FastAPI) -> None:
    async with client_of(gateway) as client:
        health = await client.get("/health")
        wrong_method = await client.post("/api/v1/scan/job-1/events")
        legacy = await client.get("/api/v1/stream?job_id=job-1")

    assert health.status_code == 200
    assert wrong_method.status_code == 405
    assert legacy.status_code == 401
