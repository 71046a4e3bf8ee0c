"""A chat job's events through the HTTP gateway, on the in-memory gateway with its router, as
`eco-router serve --in-memory` runs them: what a browser gets around the job's end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.application.ports import StateStore
from eco_router.domain.verdict import Verdict
from eco_router.entrypoints.container import Container, build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.settings import load_settings
from tests.contracts.factories import wait_until
from tests.environment import clear_settings

JOB = "job-late"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """The in-memory gateway and router on the documented defaults (no JWT secret)."""
    container = build_container(load_settings(), in_memory=True)
    app = create_app(container)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
            yield client, container
    container.unwire()


def frames_of(body: str) -> list[tuple[int | None, str, Any]]:
    """(id, event, data) of each frame of an SSE body, comments left out."""
    frames = []
    for raw in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in raw.split("\n") if not line.startswith(":"))
        if fields:
            frame_id = int(fields["id"]) if "id" in fields else None
            frames.append((frame_id, fields["event"], json.loads(fields["data"])))
    return frames


def judged(container: Container, verdict: str) -> float:
    """`event_router_events_total{domain="chat",verdict=...}` as the router counts it."""
    labels = {"domain": "chat", "verdict": verdict}
    return container.metrics_registry().get_sample_value("event_router_events_total", labels) or 0


async def hello_world_then_a_late_token(container: Container) -> None:
    """The issue's worker: queued (10), "Hello", " ", "world" (1001-1003), done (180, id
    1004), then one more token once the router has routed the done; back when the router
    has judged it."""
    publisher = await resolve(container.chat_demo_publisher())
    store: StateStore = await resolve(container.state_store())

    async def ended() -> bool:
        view = await store.view("chat", JOB)
        return "done" in [json.loads(p)["stage"] for p in view.history]

    await publisher.publish_stage_event(JOB, "queued", "started", seq=10)
    for seq, delta in zip((1001, 1002, 1003), ("Hello", " ", "world"), strict=True):
        await publisher.publish_token(JOB, delta, seq=seq)
    await publisher.publish_stage_event(JOB, "done", "completed", seq=180)
    await wait_until(ended, what="the job's done")
    await publisher.publish_token(JOB, "!", seq=1004)

    async def all_judged() -> bool:
        return sum(judged(container, verdict.value) for verdict in Verdict) == 6

    await wait_until(all_judged, what="the late token judged")


class TestATokenWrittenAfterTheEnd:
    async def test_a_browser_after_the_end_gets_the_whole_text_then_done(
        self, gateway: tuple[httpx.AsyncClient, Container]
    ) -> None:
        client, container = gateway
        await hello_world_then_a_late_token(container)

        response = await client.get(f"/api/v1/chat/{JOB}/events")

        assert response.status_code == 200
        frames = frames_of(response.text)
        assert [(frame_id, event) for frame_id, event, _ in frames] == [
            (10, "queued"),
            (1003, "token_recovery"),
            (1004, "done"),
        ]
        assert frames[1][2]["accumulated"] == "Hello world"
        assert frames[2][2]["text_check"]["bytes"] == len(b"Hello world")
        assert judged(container, "stale") == 1

    async def test_a_browser_resuming_before_the_end_reads_the_job_from_the_store_once(
        self, gateway: tuple[httpx.AsyncClient, Container]
    ) -> None:
        client, container = gateway
        await hello_world_then_a_late_token(container)
        store = await resolve(container.state_store())
        assert isinstance(store, InMemoryStateStore)
        views_before = store.views

        response = await client.get(f"/api/v1/chat/{JOB}/events", headers={"Last-Event-ID": "1003"})

        assert [(i, e) for i, e, _ in frames_of(response.text)] == [(1004, "done")]
        # The read that gives the replay also tells whether the client has the end already.
        assert store.views - views_before == 1

    async def test_a_browser_resuming_from_done_is_told_to_stop_with_204(
        self, gateway: tuple[httpx.AsyncClient, Container]
    ) -> None:
        client, container = gateway
        await hello_world_then_a_late_token(container)

        response = await client.get(f"/api/v1/chat/{JOB}/events", headers={"Last-Event-ID": "1004"})

        assert (response.status_code, response.text) == (204, "")
