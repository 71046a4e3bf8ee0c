"""Viewer counts through `serve --in-memory`: the console's job lookup JSON, /metrics and
/ready, as the presence poster runs in the app's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from eco_router.adapters.memory.presence_board import InMemoryPresenceBoard
from eco_router.entrypoints.container import Container, build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.settings import load_settings
from tests.environment import clear_settings
from tests.unit.factories import eventually


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


@pytest.fixture
async def served() -> AsyncIterator[tuple[FastAPI, Container]]:
    """`serve --in-memory --demo` with the console and /metrics on, posting every 0.1 s."""
    settings = load_settings(
        console=True, gateway_metrics=True, presence_interval_s=0.1, consumer_name="gateway-a"
    )
    container = build_container(settings, in_memory=True)
    app = create_app(container, demo=True)
    async with LifespanManager(app):
        yield app, container
    container.unwire()


def client_of(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 40_000))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.test")


class TestTheConsoleJobLookup:
    async def test_it_shows_the_viewers_per_gateway_as_streams_open_and_close(
        self, served: tuple[FastAPI, Container]
    ) -> None:
        app, container = served
        async with client_of(app) as client:
            job_id = (await client.post("/api/v1/demo/jobs")).json()["job_id"]
            lookup = f"/console/api/jobs/scan/{job_id}"

            async def viewers_are(expected: object) -> bool:
                found = await client.get(lookup)
                return found.status_code == 200 and found.json()["viewers"] == expected

            stream = await resolve(container.stream_job_events())
            opened = [await stream.open("scan", job_id) for _ in range(2)]
            try:
                await eventually(
                    lambda: viewers_are({"total": 2, "by_gateway": {"gateway-a": 2}}), every_s=0.02
                )
                metrics = (await client.get("/metrics")).text
                ready = (await client.get("/ready")).json()
            finally:
                await opened.pop().aclose()
            await eventually(
                lambda: viewers_are({"total": 1, "by_gateway": {"gateway-a": 1}}), every_s=0.02
            )
            await opened.pop().aclose()
            await eventually(lambda: viewers_are({"total": 0, "by_gateway": {}}), every_s=0.02)

        assert 'event_router_gateway_viewers{domain="scan"} 2.0' in metrics
        assert 'event_router_gateway_jobs_watched{domain="scan"} 1.0' in metrics
        assert ready["checks"]["presence"] == "ok"


class TestThePresencePoster:
    async def test_a_board_out_of_reach_shows_in_readiness_without_failing_it(
        self, served: tuple[FastAPI, Container]
    ) -> None:
        app, container = served
        board = await resolve(container.presence_board())
        assert isinstance(board, InMemoryPresenceBoard)
        async with client_of(app) as client:

            async def presence_check() -> str:
                return str((await client.get("/ready")).json()["checks"]["presence"])

            board.available = False
            # The public port names the failing component only; the cause is in the log.
            await eventually(lambda: _is(presence_check(), "presence failing"), every_s=0.02)
            # Viewer counts are for display: the gateway still streams, so it stays in rotation.
            ready = await client.get("/ready")
            assert (ready.status_code, ready.json()["ready"]) == (200, True)
            board.available = True
            await eventually(lambda: _is(presence_check(), "ok"), every_s=0.02)

    async def test_a_clean_stop_takes_the_gateways_counts_off_the_board(self) -> None:
        settings = load_settings(presence_interval_s=0.1, consumer_name="gateway-a")
        container = build_container(settings, in_memory=True)
        app = create_app(container)
        board = await resolve(container.presence_board())
        async with LifespanManager(app):
            stream = await resolve(container.stream_job_events())
            opened = await stream.open("scan", "job-1")
            await eventually(lambda: board.viewers("scan", "job-1"), every_s=0.02)
        container.unwire()

        assert await board.viewers("scan", "job-1") == {}
        await opened.aclose()


async def _is(text: Awaitable[str], expected: str) -> bool:
    return await text == expected
