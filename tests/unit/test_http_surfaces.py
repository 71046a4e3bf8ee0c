"""What each HTTP port serves: the gateway's optional /metrics and API docs, the throttled demo
endpoint, the favicon, and the worker's probes-only app; on the in-memory adapters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.http.app import DEMO_JOBS_PER_CLIENT_BURST, create_app, create_ops_app
from eco_router.entrypoints.settings import load_settings
from tests.environment import clear_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


def client_of(app: FastAPI, address: str = "192.0.2.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40_000))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.test")


@pytest.fixture
async def gateway() -> AsyncIterator[FastAPI]:
    """`eco-router serve --in-memory --demo` with the documented defaults."""
    container = build_container(load_settings(), in_memory=True)
    app = create_app(container, demo=True)
    async with LifespanManager(app):
        yield app
    container.unwire()


class TestGatewayMetrics:
    async def test_metrics_are_not_served_by_default(self, gateway: FastAPI) -> None:
        async with client_of(gateway) as client:
            metrics = await client.get("/metrics")
            health = await client.get("/health")

        assert metrics.status_code == 404
        assert health.status_code == 200

    async def test_the_setting_serves_metrics(self) -> None:
        container = build_container(load_settings(gateway_metrics=True), in_memory=True)
        app = create_app(container)
        try:
            async with LifespanManager(app), client_of(app) as client:
                metrics = await client.get("/metrics")
        finally:
            container.unwire()

        assert metrics.status_code == 200
        assert "event_router_events_total" in metrics.text


class TestDemoJobThrottle:
    async def test_a_client_past_its_burst_gets_429_with_retry_after(
        self, gateway: FastAPI
    ) -> None:
        async with client_of(gateway) as client:
            started = [
                (await client.post("/api/v1/demo/jobs")).status_code
                for _ in range(DEMO_JOBS_PER_CLIENT_BURST)
            ]
            refused = await client.post("/api/v1/demo/jobs")

        assert started == [201] * DEMO_JOBS_PER_CLIENT_BURST
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert "try again" in refused.json()["detail"]

    async def test_another_client_can_still_start_a_job(self, gateway: FastAPI) -> None:
        async with client_of(gateway, "192.0.2.1") as first:
            for _ in range(DEMO_JOBS_PER_CLIENT_BURST + 1):
                await first.post("/api/v1/demo/jobs")
        async with client_of(gateway, "192.0.2.2") as second:
            response = await second.post("/api/v1/demo/jobs")

        assert response.status_code == 201


class TestApiDocs:
    @pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
    async def test_api_docs_are_not_served_by_default(self, gateway: FastAPI, path: str) -> None:
        async with client_of(gateway) as client:
            response = await client.get(path)

        assert response.status_code == 404

    async def test_api_docs_when_enabled_list_the_public_api_and_never_the_console(
        self,
    ) -> None:
        container = build_container(load_settings(api_docs=True, console=True), in_memory=True)
        try:
            async with client_of(create_app(container, demo=True)) as client:
                docs = await client.get("/docs")
                redoc = await client.get("/redoc")
                schema = await client.get("/openapi.json")
        finally:
            container.unwire()

        assert (docs.status_code, redoc.status_code, schema.status_code) == (200, 200, 200)
        paths = schema.json()["paths"]
        assert "/api/v1/{domain}/{job_id}/events" in paths
        assert not [path for path in paths if path.startswith("/console")]
        assert "console" not in schema.text


class TestFavicon:
    async def test_the_favicon_is_an_svg_not_a_404(self, gateway: FastAPI) -> None:
        async with client_of(gateway) as client:
            response = await client.get("/favicon.ico")

        assert response.status_code == 200
        assert response.headers["content-type"] == "image/svg+xml"
        assert response.content.startswith(b"<svg")


class TestWorkerPort:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("GET", "/"),
            ("GET", "/api/v1/scan/job-1/events"),
            ("GET", "/api/v1/stream?job_id=job-1"),
            ("POST", "/api/v1/demo/jobs"),
            ("GET", "/docs"),
            ("GET", "/openapi.json"),
        ],
    )
    async def test_the_gateway_and_demo_are_not_served(self, method: str, path: str) -> None:
        container = build_container(load_settings(), in_memory=True)
        try:
            # A bound so that an SSE stream served here fails the test instead of hanging it.
            async with client_of(create_ops_app(container)) as client, asyncio.timeout(10):
                response = await client.request(method, path)
        finally:
            container.unwire()

        assert response.status_code == 404

    async def test_health_and_metrics_are_served(self) -> None:
        container = build_container(load_settings(), in_memory=True)
        try:
            async with client_of(create_ops_app(container)) as client:
                health = await client.get("/health")
                metrics = await client.get("/metrics")
        finally:
            container.unwire()

        assert health.json() == {"status": "ok"}
        assert metrics.status_code == 200
