"""A chat job's answer as the AI SDK's UI message stream through the HTTP gateway, on the
in-memory gateway with its router: the parts, the 204 of a reconnect after the end, and the
job stream's refusals and metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest
from asgi_lifespan import LifespanManager

from eco_router.application.ports import StateStore
from eco_router.entrypoints.container import Container, build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.settings import load_settings
from tests.contracts.factories import wait_until
from tests.environment import clear_settings

JOB = "job-answered"
SECRET = "ui-message-stream-tests-secret-0123456789"
Gateway = tuple[httpx.AsyncClient, Container]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


async def gateway_of(**settings: Any) -> AsyncIterator[Gateway]:
    container = build_container(load_settings(**settings), in_memory=True)
    app = create_app(container)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
            yield client, container
    container.unwire()


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    """The in-memory gateway and router on the documented defaults (no JWT secret)."""
    async for opened in gateway_of():
        yield opened


@pytest.fixture
async def secured() -> AsyncIterator[Gateway]:
    async for opened in gateway_of(jwt_secret=SECRET):
        yield opened


def token_for(*jobs: str, domain: str = "chat") -> str:
    claims = {"domain": domain, "jobs": list(jobs), "exp": int(time.time()) + 600}
    return jwt.encode(claims, SECRET, algorithm="HS256")


async def answered(container: Container, *, status: str = "done") -> None:
    """queued, "Hello", " ", "world", then the end (`status`), routed."""
    publisher = await resolve(container.chat_demo_publisher())
    store: StateStore = await resolve(container.state_store())
    await publisher.publish_stage_event(JOB, "queued", "started", seq=10)
    for seq, delta in zip((1001, 1002, 1003), ("Hello", " ", "world"), strict=True):
        await publisher.publish_token(JOB, delta, seq=seq)
    if status == "failed":
        await publisher.publish_stage_event(
            JOB, "answer", "failed", seq=170, result={"error": "model overloaded"}
        )
    else:
        await publisher.publish_stage_event(JOB, "done", status, seq=180)

    async def ended() -> bool:
        view = await store.view("chat", JOB)
        return any(json.loads(p)["seq"] in (170, 180) for p in view.history)

    await wait_until(ended, what="the job's end")


def parts_of(body: str) -> list[Any]:
    """The `data:` of each frame, `[DONE]` as it is."""
    parts = []
    for raw in body.strip().split("\n\n"):
        assert raw.startswith("data: "), raw
        data = raw.removeprefix("data: ")
        parts.append(data if data == "[DONE]" else json.loads(data))
    return parts


def closed(container: Container, reason: str) -> float:
    registry = container.metrics_registry()
    labels = {"reason": reason}
    return registry.get_sample_value("event_router_gateway_connections_closed_total", labels) or 0


class TestTheSend:
    async def test_an_ended_answer_is_sent_whole_then_finished(self, gateway: Gateway) -> None:
        client, container = gateway
        await answered(container)

        response = await client.post(f"/api/v1/chat/{JOB}/stream", json={"messages": []})

        assert response.status_code == 200
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert response.headers["content-type"].startswith("text/event-stream")
        parts = parts_of(response.text)
        assert parts[:-2] == [
            {"type": "start", "messageId": JOB},
            {"type": "start-step"},
            {"type": "text-start", "id": "text-1"},
            {"type": "text-delta", "id": "text-1", "delta": "Hello world"},
            {"type": "text-end", "id": "text-1"},
            {"type": "finish-step"},
        ]
        finish = parts[-2]
        assert finish["finishReason"] == "stop"
        assert finish["messageMetadata"]["text_check"]["bytes"] == len(b"Hello world")
        assert parts[-1] == "[DONE]"
        assert closed(container, "done") == 1

    async def test_a_failed_answer_ends_with_an_error_and_a_finish(self, gateway: Gateway) -> None:
        client, container = gateway
        await answered(container, status="failed")

        response = await client.post(f"/api/v1/chat/{JOB}/stream")

        types = [p if p == "[DONE]" else p["type"] for p in parts_of(response.text)]
        assert types[-5:] == ["text-end", "error", "finish-step", "finish", "[DONE]"]
        assert parts_of(response.text)[-4]["errorText"] == "answer failed: model overloaded"


def held_text(parts: list[Any]) -> str:
    """The text a reader of the parts holds: `reset-step` drops what the step held."""
    texts: dict[str, str] = {}
    for part in parts:
        if part == "[DONE]":
            continue
        if part["type"] == "reset-step":
            texts = {}
        elif part["type"] == "text-delta":
            texts[part["id"]] = texts.get(part["id"], "") + part["delta"]
    return "".join(texts.values())


def opened(container: Container) -> float:
    registry = container.metrics_registry()
    return registry.get_sample_value("event_router_gateway_connections_opened_total") or 0


class TestLive:
    async def test_a_retried_attempt_replaces_the_text_for_a_reader_watching(
        self, gateway: Gateway
    ) -> None:
        client, container = gateway
        publisher = await resolve(container.chat_demo_publisher())
        reading = asyncio.create_task(client.post(f"/api/v1/chat/{JOB}/stream"))

        async def open_now() -> bool:
            return opened(container) == 1

        await wait_until(open_now, what="the stream open")
        for seq, delta in zip((1001, 1002), ("first ", "try"), strict=True):
            await publisher.publish_token(JOB, delta, seq=seq)
        store: StateStore = await resolve(container.state_store())

        async def first_routed() -> bool:
            # Routed is published: the stream's queue holds the first attempt's tokens.
            text = await store.text("chat", JOB)
            return text is not None and text.text == b"first try"

        await wait_until(first_routed, what="the first attempt routed")
        for seq, delta in zip((1001, 1002), ("second ", "try"), strict=True):
            await publisher.publish_token(JOB, delta, seq=seq, attempt=1)
        await publisher.publish_stage_event(JOB, "done", "done", seq=180)

        async with asyncio.timeout(10):
            response = await reading

        parts = parts_of(response.text)
        assert held_text(parts) == "second try"
        deltas = [p["delta"] for p in parts if p != "[DONE]" and p["type"] == "text-delta"]
        assert "".join(deltas).startswith("first try")
        assert {"type": "reset-step"} in parts
        assert parts[-2]["messageMetadata"]["text_check"]["bytes"] == len(b"second try")


class TestTheReconnect:
    async def test_a_reconnect_after_the_end_is_204(self, gateway: Gateway) -> None:
        client, container = gateway
        await answered(container, status="cancelled")

        response = await client.get(f"/api/v1/chat/{JOB}/stream")

        assert (response.status_code, response.text) == (204, "")


class TestRefusals:
    @pytest.mark.parametrize(
        ("path", "status", "detail"),
        [
            ("/api/v1/chat/bad%20id/stream", 422, "job_id must be 1-128 characters"),
            ("/api/v1/mail/J/stream", 404, "unknown domain 'mail'"),
        ],
    )
    async def test_a_malformed_request_is_refused_in_one_line(
        self, gateway: Gateway, path: str, status: int, detail: str
    ) -> None:
        client, _ = gateway
        for method in ("GET", "POST"):
            response = await client.request(method, path)
            assert response.status_code == status
            assert response.json()["detail"].startswith(detail)

    async def test_a_stream_needs_a_token_for_the_job(self, secured: Gateway) -> None:
        client, container = secured
        await answered(container)
        path = f"/api/v1/chat/{JOB}/stream"

        assert (await client.get(path)).status_code == 401
        other = {"Authorization": f"Bearer {token_for('another-job')}"}
        assert (await client.get(path, headers=other)).status_code == 403
        scan = {"Authorization": f"Bearer {token_for(JOB, domain='scan')}"}
        assert (await client.post(path, headers=scan)).status_code == 403
        granted = {"Authorization": f"Bearer {token_for(JOB)}"}
        response = await client.post(path, headers=granted)
        assert response.status_code == 200
        assert parts_of(response.text)[-1] == "[DONE]"
