"""The control routes on the in-memory gateway with its router: validation, authorization,
idempotency, the refusal once a job ended, and the announcement in the job's events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer
from eco_router.adapters.jwt_authorizer import JwtAuthorizer
from eco_router.application.ports import ControlStore, StateStore
from eco_router.domain.control import MAX_CONTROL_BODY_BYTES
from eco_router.entrypoints.container import Container, build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.settings import load_settings
from tests.contracts.factories import wait_until
from tests.environment import clear_settings

SECRET = "a-test-secret-that-is-long-enough-for-hs256!"
JOB = "job-7"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


async def started(**overrides: Any) -> tuple[FastAPI, Container, LifespanManager]:
    container = build_container(load_settings(**overrides), in_memory=True)
    app = create_app(container)
    manager = LifespanManager(app)
    await manager.__aenter__()
    return app, container, manager


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """`eco-router serve --in-memory` on the documented defaults (no JWT secret), with the
    chat job `JOB` started."""
    app, container, manager = await started()
    await start(container, JOB)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
        yield client, container
    await manager.__aexit__(None, None, None)
    container.unwire()


async def history_stages(container: Container, domain: str, job_id: str) -> list[str]:
    store: StateStore = await resolve(container.state_store())
    view = await store.view(domain, job_id)
    return [json.loads(p)["stage"] for p in view.history]


async def start(container: Container, job_id: str) -> None:
    """Publish the chat job's `queued` and wait until the router applied it."""
    publisher = await resolve(container.chat_demo_publisher())
    await publisher.publish_stage_event(job_id, "queued", "queued")

    async def known() -> bool:
        return "queued" in await history_stages(container, "chat", job_id)

    await wait_until(known, what="the job's queued")


async def end(container: Container, job_id: str) -> None:
    publisher = await resolve(container.chat_demo_publisher())
    await publisher.publish_stage_event(job_id, "done", "done")

    async def ended() -> bool:
        return "done" in await history_stages(container, "chat", job_id)

    await wait_until(ended, what="the job's done")


class TestRecording:
    async def test_a_cancel_is_accepted_with_its_receipt(self, gateway: Any) -> None:
        client, _ = gateway

        response = await client.post(
            f"/api/v1/chat/{JOB}/cancel", headers={"Idempotency-Key": "k1"}
        )

        assert response.status_code == 202
        assert response.json() == {
            "request_id": "k1",
            "message_id": response.json()["message_id"],
            "number": 1,
            "kind": "cancel",
            "job_id": JOB,
            "events": f"/api/v1/chat/{JOB}/events",
        }

    async def test_a_duplicate_post_is_applied_once_and_answers_the_same(
        self, gateway: Any
    ) -> None:
        client, container = gateway
        body = {"request_id": "r1", "input": "oui"}

        first = await client.post(f"/api/v1/chat/{JOB}/input", json=body)
        again = await client.post(f"/api/v1/chat/{JOB}/input", json=body)

        assert (first.status_code, again.status_code) == (202, 202)
        assert first.json() == again.json()
        assert again.headers["idempotent-replayed"] == "true"
        store: ControlStore = await resolve(container.control_store())
        assert (await store.messages("chat", JOB)).total == 1

    async def test_viewers_see_the_announcement_in_the_jobs_events(self, gateway: Any) -> None:
        client, container = gateway
        await client.post(f"/api/v1/chat/{JOB}/input", json={"request_id": "a", "input": "x"})
        await client.post(f"/api/v1/chat/{JOB}/cancel", json={"request_id": "b"})

        async def both() -> bool:
            stages = await history_stages(container, "chat", JOB)
            return stages == ["queued", "input_received", "cancel_requested"]

        await wait_until(both, what="both announcements")

    async def test_a_control_after_done_is_refused_with_409(self, gateway: Any) -> None:
        client, container = gateway
        await end(container, JOB)

        response = await client.post(f"/api/v1/chat/{JOB}/cancel", headers={"Idempotency-Key": "z"})

        assert response.status_code == 409
        assert response.json() == {"detail": f"job {JOB} has already ended"}

    async def test_the_reference_call_needs_no_request_id(self, gateway: Any) -> None:
        client, container = gateway

        first = await client.post(f"/chat/{JOB}/input", json={"input": "yes"})
        second = await client.post(f"/chat/{JOB}/input", json={"input": "yes"})

        assert (first.status_code, second.status_code) == (202, 202)
        store: ControlStore = await resolve(container.control_store())
        page = await store.messages("chat", JOB)
        assert [m.preview for m in page.messages] == ['{"input":"yes"}'] * 2


class TestValidation:
    @pytest.mark.parametrize(
        ("path", "content", "headers", "status", "detail"),
        [
            ("/api/v1/chat/job-7/input", b'{"request_id":"k","input":1}',
             {"Content-Type": "text/plain"}, 415,
             "the body must be sent as Content-Type: application/json"),
            ("/api/v1/chat/job-7/input", b'{"input":1}', {}, 422,
             "an Idempotency-Key header or a request_id field is required"),
            ("/api/v1/chat/job-7/input", b"[]", {"Idempotency-Key": "k"}, 422,
             "the body must be a JSON object"),
            ("/api/v1/chat/job-7/input", b"{", {"Idempotency-Key": "k"}, 422,
             "the body is not JSON: Expecting property name enclosed in double quotes: "
             "line 1 column 2 (char 1)"),
            ("/api/v1/chat/job-7/input", b"x" * (MAX_CONTROL_BODY_BYTES + 1),
             {"Idempotency-Key": "k"}, 413, "the body has 4097 bytes (max 4096)"),
            ("/api/v1/chat/job 7/cancel", b"", {"Idempotency-Key": "k"}, 422,
             "job_id must be 1-128 characters of [A-Za-z0-9_.:-]"),
            ("/api/v1/nope/job-7/cancel", b"", {"Idempotency-Key": "k"}, 404,
             "unknown domain 'nope'; known: scan, chat"),
        ],
    )  # fmt: skip
    async def test_what_is_wrong_is_said_in_one_line(
        self,
        gateway: Any,
        path: str,
        content: bytes,
        headers: dict[str, str],
        status: int,
        detail: str,
    ) -> None:
        client, _ = gateway

        headers = {"Content-Type": "application/json"} | headers
        response = await client.post(path, content=content, headers=headers)

        assert (response.status_code, response.json()) == (status, {"detail": detail})


class TestAuthorization:
    @pytest.fixture
    async def secured(self) -> AsyncIterator[httpx.AsyncClient]:
        app, container, manager = await started(jwt_secret=SECRET)
        await start(container, JOB)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
            yield client
        await manager.__aexit__(None, None, None)
        container.unwire()

    @pytest.mark.parametrize(
        ("token", "status"),
        [
            (None, 401),
            (JwtAuthorizer(SECRET).issue("chat", ["job-8"], ttl_s=60), 403),
            (JwtAuthorizer(SECRET).issue("scan", [JOB], ttl_s=60), 403),
            (JwtAuthorizer(SECRET).issue("chat", [JOB], ttl_s=60), 202),
            (JwtAdminAuthorizer(SECRET).issue(ttl_s=60), 202),
        ],
        ids=["no token", "another job", "another domain", "the job's viewer", "an admin"],
    )
    async def test_as_the_jobs_event_stream(
        self, secured: httpx.AsyncClient, token: str | None, status: int
    ) -> None:
        headers = {"Idempotency-Key": "k"} | ({"Authorization": f"Bearer {token}"} if token else {})

        response = await secured.post(f"/api/v1/chat/{JOB}/cancel", headers=headers)

        assert response.status_code == status


class TestTheConsoleLookup:
    async def test_it_lists_the_jobs_control_messages_with_their_state(self) -> None:
        app, container, manager = await started(console=True)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
                await start(container, JOB)
                for n, kind in enumerate(["input", "cancel", "input"]):
                    body = {"request_id": f"r{n}"} | ({"input": n} if kind == "input" else {})
                    await client.post(f"/api/v1/chat/{JOB}/{kind}", json=body)
                store: ControlStore = await resolve(container.control_store())
                handed = await store.deliver("chat", JOB)
                await store.acknowledge("chat", JOB, handed.messages[0].message_id)
                await store.deliver("chat", JOB)

                async def routed() -> bool:
                    return len(await history_stages(container, "chat", JOB)) == 4

                await wait_until(routed, what="the job's events")
                found = await client.get(f"/console/api/jobs/chat/{JOB}")
        finally:
            await manager.__aexit__(None, None, None)
            container.unwire()

        assert found.status_code == 200
        controls = found.json()["controls"]
        assert [(c["number"], c["kind"], c["state"], c["deliveries"]) for c in controls] == [
            (1, "input", "acknowledged", 1),
            (2, "cancel", "delivered", 2),
            (3, "input", "delivered", 2),
        ]
        assert [(c["bytes"], c["preview"]) for c in controls] == [
            (len('{"input":0}'), None),
            (2, "{}"),
            (len('{"input":2}'), '{"input":2}'),
        ]
        assert controls[1]["request_id"] == "r1"
        assert found.json()["control_totals"] == {"messages": 3, "waiting": 2, "waiting_bytes": 13}
