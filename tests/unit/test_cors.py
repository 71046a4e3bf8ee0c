"""`EVENT_ROUTER_CORS_ORIGINS`: the origins whose pages may read job events, with credentials."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.settings import ConfigError, load_settings

LISTED = "https://app.example.com"
# An invalid resume point answers at once (422): the headers are what is checked.
EVENTS = "/api/v1/scan/job-1/events?last_event_id=x"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("EVENT_ROUTER_", "REDIS_")):
            monkeypatch.delenv(name)


async def _gateway(**settings: str) -> AsyncIterator[httpx.AsyncClient]:
    container = build_container(load_settings(**settings), in_memory=True)
    app: FastAPI = create_app(container)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
            yield client
    container.unwire()


@pytest.fixture
async def gateway() -> AsyncIterator[httpx.AsyncClient]:
    async for client in _gateway(cors_origins=f"{LISTED}, http://localhost:3000"):
        yield client


@pytest.fixture
async def same_origin_gateway() -> AsyncIterator[httpx.AsyncClient]:
    async for client in _gateway():
        yield client


async def test_a_listed_origin_may_read_job_events_with_credentials(
    gateway: httpx.AsyncClient,
) -> None:
    response = await gateway.get(EVENTS, headers={"Origin": LISTED})

    assert response.status_code == 422
    assert response.headers["access-control-allow-origin"] == LISTED
    assert response.headers["access-control-allow-credentials"] == "true"
    assert "Origin" in response.headers["vary"]


async def test_an_unlisted_origin_gets_no_cors_headers(gateway: httpx.AsyncClient) -> None:
    response = await gateway.get(EVENTS, headers={"Origin": "https://evil.example.net"})

    assert "access-control-allow-origin" not in response.headers


async def test_a_preflight_for_a_reconnect_is_answered_for_listed_origins_only(
    gateway: httpx.AsyncClient,
) -> None:
    preflight = {
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "last-event-id, authorization",
    }
    listed = await gateway.options(EVENTS, headers={"Origin": LISTED, **preflight})
    unlisted = await gateway.options(
        EVENTS, headers={"Origin": "https://evil.example.net", **preflight}
    )

    assert listed.status_code == 200
    assert listed.headers["access-control-allow-origin"] == LISTED
    assert listed.headers["access-control-allow-credentials"] == "true"
    assert "last-event-id" in listed.headers["access-control-allow-headers"].lower()
    assert unlisted.status_code == 400
    assert "access-control-allow-origin" not in unlisted.headers


async def test_the_console_and_ops_endpoints_stay_same_origin(gateway: httpx.AsyncClient) -> None:
    for path in ("/ready", "/console/api/snapshot", "/health"):
        response = await gateway.get(path, headers={"Origin": LISTED})

        assert "access-control-allow-origin" not in response.headers, path


async def test_without_the_setting_no_origin_is_allowed(
    same_origin_gateway: httpx.AsyncClient,
) -> None:
    response = await same_origin_gateway.get(EVENTS, headers={"Origin": LISTED})

    assert "access-control-allow-origin" not in response.headers


def test_origins_are_written_as_browsers_send_them() -> None:
    settings = load_settings(
        cors_origins="https://App.Example.com:443, http://localhost:3000,,http://[::1]:8080"
    )

    assert settings.cors_origins == (
        "https://app.example.com",
        "http://localhost:3000",
        "http://[::1]:8080",
    )


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("*", "wildcards are not allowed"),
        ("https://*.example.com", "wildcards are not allowed"),
        ("https://app.example.com/", "no path"),
        ("https://app.example.com/events", "no path"),
        ("app.example.com", "starts with http:// or https://"),
        ("https://app.example.com:70000", "is not an origin"),
        ("https://app example.com", "is not a host name"),
    ],
)
def test_a_bad_origin_stops_startup_with_one_line(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(cors_origins=value)

    message = str(error.value)
    assert message.startswith("invalid configuration: EVENT_ROUTER_CORS_ORIGINS:")
    assert says in message
    assert "\n" not in message


async def test_a_listed_origin_may_post_a_cancel_with_its_idempotency_key(
    gateway: httpx.AsyncClient,
) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, idempotency-key, authorization",
    }
    allowed = await gateway.options(
        "/api/v1/chat/job-1/cancel", headers={"Origin": LISTED, **preflight}
    )
    refused = await gateway.options(
        "/api/v1/chat/job-1/cancel", headers={"Origin": "https://evil.example.net", **preflight}
    )

    assert allowed.status_code == 200
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "idempotency-key" in allowed.headers["access-control-allow-headers"].lower()
    assert refused.status_code == 400
