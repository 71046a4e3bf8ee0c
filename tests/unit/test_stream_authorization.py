"""Authorizing a stream costs one check of the token, whatever the jobs it names or asks
for, and a token past the size bound is refused before it is decoded; on the in-memory
gateway with a JWT secret."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import pytest
from asgi_lifespan import LifespanManager
from dependency_injector import providers
from fastapi import FastAPI

from eco_router.adapters.jwt_authorizer import JwtAuthorizer
from eco_router.application.ports import Authorizer
from eco_router.domain.grant import Grant
from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.settings import load_settings
from tests.environment import clear_settings

SECRET = "a-test-secret-that-is-long-enough-for-hs256"
NAMED = 50
REFUSED_WITHIN_S = 5.0


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


class CountingAuthorizer(Authorizer):
    """The gateway's JWT authorizer, counting the checks of a token (each one decodes it)."""

    def __init__(self, inner: JwtAuthorizer) -> None:
        self.inner = inner
        self.checks = 0

    def authorize(self, token: str | None, job_id: str, *, domain: str) -> None:
        self.checks += 1
        self.inner.authorize(token, job_id, domain=domain)

    def grant(self, token: str | None) -> Grant:
        self.checks += 1
        return self.inner.grant(token)


@dataclass
class Gateway:
    client: httpx.AsyncClient
    authorizer: CountingAuthorizer


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    """`serve --in-memory` with a JWT secret and the documented defaults otherwise."""
    container = build_container(load_settings(jwt_secret=SECRET), in_memory=True)
    counting = CountingAuthorizer(JwtAuthorizer(SECRET))
    container.authorizer.override(providers.Object(counting))
    app: FastAPI = create_app(container)
    transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 40_000))
    async with (
        LifespanManager(app),
        httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client,
    ):
        yield Gateway(client, counting)
    container.unwire()


def token_of(jobs: list[str], **claims: Any) -> str:
    payload = {"domain": "scan", "jobs": jobs, "exp": int(time.time()) + 60, **claims}
    return jwt.encode(payload, SECRET, algorithm="HS256")


def job(number: int) -> str:
    return f"job-{number:04d}"


def streams_path(numbers: range) -> str:
    return "/api/v1/streams?" + "&".join(f"job=scan:{job(n)}" for n in numbers)


class TestManyJobsAuthorization:
    async def test_the_token_is_checked_once_for_fifty_named_jobs(self, gateway: Gateway) -> None:
        # Granted all but the last named job (last in the set's order too): every job is looked
        # at before the refusal.
        token = token_of([job(n) for n in range(NAMED - 1)])

        response = await gateway.client.get(
            streams_path(range(NAMED)), headers={"Authorization": f"Bearer {token}"}
        )

        assert response.status_code == 403
        assert response.json() == {"detail": "the token does not grant this job"}
        assert gateway.authorizer.checks == 1

    async def test_a_token_past_the_bound_is_refused_with_one_line_before_any_job(
        self, gateway: Gateway
    ) -> None:
        # About 28 KB, naming every job asked for: valid but for its size.
        token = token_of([f"{job(n)}-{'x' * 13}" for n in range(1000)] + [job(0)])
        assert len(token) > 8 * 1024

        # A stream granted would not end: the refusal must come at once.
        async with asyncio.timeout(REFUSED_WITHIN_S):
            response = await gateway.client.get(
                streams_path(range(1)), headers={"Authorization": f"Bearer {token}"}
            )

        assert response.status_code == 401
        assert response.json() == {
            "detail": "the token is longer than 8192 bytes, the most accepted"
        }
        assert response.headers["www-authenticate"] == "Bearer"

    async def test_too_many_named_jobs_are_refused_before_the_token_is_checked(
        self, gateway: Gateway
    ) -> None:
        token = token_of([job(n) for n in range(NAMED + 1)])

        response = await gateway.client.get(
            streams_path(range(NAMED + 1)), headers={"Authorization": f"Bearer {token}"}
        )

        assert response.status_code == 422
        assert gateway.authorizer.checks == 0

    async def test_a_single_job_stream_checks_its_token_once(self, gateway: Gateway) -> None:
        token = token_of(["other-job"])

        response = await gateway.client.get(
            f"/api/v1/scan/{job(1)}/events", headers={"Authorization": f"Bearer {token}"}
        )

        assert response.status_code == 403
        assert gateway.authorizer.checks == 1
