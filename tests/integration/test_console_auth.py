"""Who may open the operator console: off by default, admin tokens only when a secret is set.

The app runs on the in-memory adapters: what is checked here is the HTTP layer alone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import jwt
import pytest
from asgi_lifespan import LifespanManager

from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.http.app import create_app, create_ops_app
from eco_router.entrypoints.settings import load_settings
from tests.environment import clear_settings

SECRET = "console-secret-" + "s" * 49
COOKIE = "eco_router_token"
# The stream is left out where access is granted: it would not end (tests/integration/
# test_console_api.py reads it over a real socket).
DATA = ["/console/api/snapshot", "/console/api/dead-letters", "/console/api/jobs/scan/job-1"]
GUARDED = [*DATA, "/console/api/stream"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


def token(secret: str = SECRET, **claims: Any) -> str:
    payload: dict[str, Any] = {"exp": int(time.time()) + 600, **claims}
    return jwt.encode(payload, secret, algorithm="HS256")


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


@asynccontextmanager
async def console(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app on in-memory adapters with `settings`, and a client for it."""
    container = build_container(
        load_settings(consumer_name="console-test", **settings), in_memory=True
    )
    app = create_app(container)
    try:
        async with (
            LifespanManager(app) as manager,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=manager.app), base_url="http://console.test"
            ) as client,
        ):
            yield client
    finally:
        container.unwire()


@pytest.fixture
async def secured() -> AsyncIterator[httpx.AsyncClient]:
    async with console(console=True, jwt_secret=SECRET) as client:
        yield client


class TestOffByDefault:
    @pytest.mark.parametrize("path", ["/console", *GUARDED])
    async def test_every_console_route_is_404_unless_the_console_is_on(self, path: str) -> None:
        async with console() as client:
            response = await client.get(path)

        assert response.status_code == 404

    async def test_an_admin_token_does_not_open_a_console_that_is_off(self) -> None:
        async with console(jwt_secret=SECRET) as client:
            response = await client.get(DATA[0], headers=bearer(token(admin=True)))

        assert response.status_code == 404

    async def test_replay_is_404_too(self) -> None:
        async with console() as client:
            response = await client.post(
                "/console/api/dead-letters/replay", json={"domain": "scan", "ids": ["1-1"]}
            )

        assert response.status_code == 404

    async def test_the_workers_port_never_serves_the_console(self) -> None:
        container = build_container(
            load_settings(consumer_name="console-test", console=True), in_memory=True
        )
        # What `eco-router worker` serves next to its router.
        app = create_ops_app(container)
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://worker.test"
            ) as client:
                page = await client.get("/console")
                data = await client.get(DATA[0])
        finally:
            container.unwire()

        assert (page.status_code, data.status_code) == (404, 404)


class TestWithASecret:
    async def test_the_page_loads_without_a_token_so_it_can_ask_for_one(
        self, secured: httpx.AsyncClient
    ) -> None:
        response = await secured.get("/console")

        assert response.status_code == 200
        assert "<title>eco-router · console</title>" in response.text
        assert "default-src 'none'" in response.headers["content-security-policy"]

    @pytest.mark.parametrize("path", GUARDED)
    async def test_no_token_is_401(self, secured: httpx.AsyncClient, path: str) -> None:
        response = await secured.get(path)

        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"

    @pytest.mark.parametrize("path", GUARDED)
    async def test_a_job_token_is_403(self, secured: httpx.AsyncClient, path: str) -> None:
        response = await secured.get(path, headers=bearer(token(jobs=["*"])))

        assert response.status_code == 403
        assert "admin" in response.json()["detail"]

    async def test_an_admin_token_signed_with_another_secret_is_401(
        self, secured: httpx.AsyncClient
    ) -> None:
        forged = token(secret="another-secret-" + "o" * 49, admin=True)

        response = await secured.get(DATA[0], headers=bearer(forged))

        assert response.status_code == 401

    async def test_replay_needs_an_admin_token_too(self, secured: httpx.AsyncClient) -> None:
        body = {"domain": "scan", "all_matching": True}

        anonymous = await secured.post("/console/api/dead-letters/replay", json=body)
        as_viewer = await secured.post(
            "/console/api/dead-letters/replay", json=body, headers=bearer(token(jobs=["*"]))
        )
        as_admin = await secured.post(
            "/console/api/dead-letters/replay", json=body, headers=bearer(token(admin=True))
        )

        assert (anonymous.status_code, as_viewer.status_code) == (401, 403)
        assert as_admin.status_code == 200
        assert as_admin.json() == {"replayed": []}

    @pytest.mark.parametrize("path", DATA)
    async def test_an_admin_token_is_200_by_header(
        self, secured: httpx.AsyncClient, path: str
    ) -> None:
        response = await secured.get(path, headers=bearer(token(admin=True)))

        # The in-memory job store is empty: the lookup is let in and finds nothing.
        assert response.status_code == (404 if "/jobs/" in path else 200), response.text
        assert "admin" not in response.json().get("detail", "")

    async def test_an_admin_token_is_200_by_cookie(self, secured: httpx.AsyncClient) -> None:
        secured.cookies.set(COOKIE, token(admin=True))

        response = await secured.get(DATA[0])

        assert response.status_code == 200
        assert response.json()["group"] == "eventrouter"

    async def test_signing_in_keeps_an_admin_token_in_an_http_only_cookie(
        self, secured: httpx.AsyncClient
    ) -> None:
        admin = token(admin=True)

        response = await secured.post("/console/api/session", json={"token": admin})

        assert response.status_code == 204
        cookie = response.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}={admin};")
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        assert (await secured.get(DATA[0])).status_code == 200

    async def test_signing_in_with_a_job_token_is_403_and_sets_no_cookie(
        self, secured: httpx.AsyncClient
    ) -> None:
        response = await secured.post("/console/api/session", json={"token": token(jobs=["*"])})

        assert response.status_code == 403
        assert "set-cookie" not in response.headers


class TestWithoutASecret:
    async def test_the_console_is_open_and_warns_at_startup(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        async with console(console=True) as client:
            response = await client.get(DATA[0])

        assert response.status_code == 200
        assert any(
            "console" in r.getMessage() and "open to everyone" in r.getMessage()
            for r in caplog.records
            if r.levelname == "WARNING"
        )
