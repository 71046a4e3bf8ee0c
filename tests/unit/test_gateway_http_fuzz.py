"""Every HTTP input of the gateway, fuzzed: never a 5xx, never a crash, nothing left open.

The whole app (routes, auth, use case, in-memory adapters) runs in-process behind httpx's
ASGI transport; streams end quickly because the wait limit is tiny.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import jwt
import pytest
from asgi_lifespan import LifespanManager
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eco_router.entrypoints.container import build_container, use_in_memory
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.settings import load_settings

SECRET = "fuzzing-secret-of-a-decent-length-0123456789"
COOKIE = "eco_router_token"
CLIENT_ERRORS = {401, 403, 404, 405, 422, 429}

# Header values as a client can send them: Latin-1 without control characters.
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=80,
)
anything = st.text(max_size=80)
numberish = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
    st.from_regex(r"\A[0-9]{0,25}[.eE+-]?[0-9]{0,5}\Z"),
)
claims = st.dictionaries(
    st.sampled_from(["jobs", "exp", "sub", "domain"]),
    st.one_of(
        st.lists(st.one_of(st.sampled_from(["*", "job-1"]), anything), max_size=3),
        st.integers(min_value=-(2**40), max_value=2**40).map(lambda d: int(time.time()) + d),
        anything,
        st.none(),
    ),
)


def signed(claims: dict[str, Any], secret: str) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


tokens = st.one_of(
    header_text,
    st.builds(signed, claims, st.just(SECRET)),
    st.builds(signed, claims, st.just("another-secret-also-long-enough-0123456789")),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], dict[str, str]]:
    """Method, path, query and headers of a request to any route of the gateway."""
    route = draw(st.sampled_from(["events", "legacy", "demo", "page", "ops"]))
    domain = draw(st.one_of(st.sampled_from(["scan", "chat"]), anything.filter(bool)))
    job = draw(st.one_of(st.sampled_from(["job-1", "A-z_0.9:" * 16]), anything.filter(bool)))
    params: dict[str, str] = {}
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        params["last_event_id"] = draw(st.one_of(numberish, anything))
    if draw(st.booleans()):
        headers["Last-Event-ID"] = draw(st.one_of(numberish, header_text))
    if draw(st.booleans()):
        headers["Authorization"] = draw(st.sampled_from(["Bearer ", "bearer ", "Basic ", ""]))
        headers["Authorization"] += draw(tokens)
    if draw(st.booleans()):
        headers["Cookie"] = draw(
            st.one_of(st.builds(lambda t: f"{COOKIE}={t}", tokens), header_text)
        )
    if route == "events":
        return (
            "GET",
            f"/api/v1/{quote(domain, safe='')}/{quote(job, safe='')}/events",
            params,
            headers,
        )
    if route == "legacy":
        if draw(st.booleans()):
            params["job_id"] = job
        return "GET", "/api/v1/stream", params, headers
    if route == "demo":
        if draw(st.booleans()):
            params["fail"] = draw(st.one_of(st.sampled_from(["true", "0"]), anything))
        return draw(st.sampled_from(["POST", "GET"])), "/api/v1/demo/jobs", params, headers
    if route == "page":
        return "GET", "/", params, headers
    return "GET", draw(st.sampled_from(["/health", "/ready", "/metrics"])), params, headers


@pytest.fixture(params=["open", "secured"])
async def gateway(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    for name in [n for n in os.environ if n.startswith(("EVENT_ROUTER_", "REDIS_"))]:
        monkeypatch.delenv(name)  # settings come from the test alone
    overrides: dict[str, object] = {"sse_max_wait_s": 0.01, "sse_keepalive_s": 0.005}
    if request.param == "secured":
        overrides["jwt_secret"] = SECRET
    container = build_container(load_settings(**overrides))
    use_in_memory(container)
    app = create_app(container, demo=True)
    try:
        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
                yield client, app
    finally:
        container.unwire()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
async def test_no_input_gets_a_server_error_or_leaves_a_stream_open(
    gateway: tuple[httpx.AsyncClient, Any],
    request: tuple[str, str, dict[str, str], dict[str, str]],
) -> None:
    client, app = gateway
    method, path, params, headers = request

    raw_headers = {name: value.encode("latin-1") for name, value in headers.items()}
    response = await client.request(method, path, params=params, headers=raw_headers)

    assert response.status_code in {200, 201, 204} | CLIENT_ERRORS, (
        response.status_code,
        response.text[:200],
    )
    if response.status_code == 429:
        assert response.headers["Retry-After"]
    assert app.state.client_streams.open_streams("127.0.0.1") == 0
    assert (await client.get("/health")).status_code == 200
