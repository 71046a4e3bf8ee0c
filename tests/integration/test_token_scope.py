"""Tokens at the gateway: scoped to a domain, refused without an expiry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest

from tests.integration.sse_client import read_events, sse_client
from tests.integration.test_gateway import (
    SECRET,
    Gateway,
    events_path,
    module_gateway,
    new_job,
    status_of,
)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with module_gateway(tmp_path_factory, "scoped-gateway", EVENT_ROUTER_JWT_SECRET=SECRET) as gw:
        yield gw


def bearer(**claims: Any) -> dict[str, str]:
    claims.setdefault("exp", int(time.time()) + 300)
    claims = {name: value for name, value in claims.items() if value is not None}
    return {"Authorization": f"Bearer {jwt.encode(claims, SECRET, algorithm='HS256')}"}


async def test_a_scan_token_for_job_x_does_not_open_chat_job_x(secured: Gateway) -> None:
    job = new_job("scoped")
    headers = bearer(domain="scan", jobs=[job])
    async with sse_client(secured.base_url) as http:
        [first] = await read_events(http, events_path(job, "scan"), count=1, headers=headers)

    assert first.json()["job_id"] == job
    assert await status_of(secured.base_url, events_path(job, "chat"), headers=headers) == 403


async def test_a_token_naming_no_domain_still_opens_scan_jobs_only(secured: Gateway) -> None:
    job = new_job("legacy")
    headers = bearer(jobs=[job])
    async with sse_client(secured.base_url) as http:
        [first] = await read_events(http, events_path(job, "scan"), count=1, headers=headers)

    assert first.json()["job_id"] == job
    assert await status_of(secured.base_url, events_path(job, "chat"), headers=headers) == 403


async def test_a_token_without_an_expiry_is_401(secured: Gateway) -> None:
    headers = bearer(domain="scan", jobs=["*"], exp=None)

    assert await status_of(secured.base_url, events_path("job-1"), headers=headers) == 401
