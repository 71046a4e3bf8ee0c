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
# Starlette sends a path ending in a slash (`%2F` included) to the same path without it.
SLASH_REDIRECT = 307

# Header values as a client can send them: Latin-1 without control characters.
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=80,
)
anything = st.text(max_size=80)
numberish = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
    # Around the 4300 digits past which int() of a string raises.
    st.sampled_from([4300, 4301, 5000]).map(lambda n: "1" * n),
    st.from_regex(r"\A[0-9]{0,25}[.eE+-]?[0-9]{0,5}\Z"),
)
claims = st.dictionaries(
    st.sampled_from(["jobs", "exp", "sub", "domain", "admin"]),
    st.one_of(
        st.lists(st.one_of(st.sampled_from(["*", "job-1"]), anything), max_size=3),
        st.integers(min_value=-(2**40), max_value=2**40).map(lambda d: int(time.time()) + d),
        anything,
        st.none(),
        st.booleans(),
    ),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | anything,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(anything, inner, max_size=3),
    max_leaves=8,
)
replay_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "domain": st.one_of(st.sampled_from(["scan", "chat"]), anything),
            "ids": st.one_of(
                st.none(), st.lists(st.one_of(st.just("1700000000000-0"), anything), max_size=3)
            ),
            "all_matching": st.one_of(st.booleans(), json_values),
            "reason": st.one_of(st.none(), anything),
            "q": st.one_of(st.none(), anything),
        },
    ),
)


def signed(claims: dict[str, Any], secret: str) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


tokens = st.one_of(
    header_text,
    st.builds(
        lambda: signed({"jobs": ["*"], "admin": True, "exp": int(time.time()) + 600}, SECRET)
    ),
    st.builds(signed, claims, st.just(SECRET)),
    st.builds(signed, claims, st.just("another-secret-also-long-enough-0123456789")),
)


Request = tuple[str, str, dict[str, str], dict[str, str], object]


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Method, path, query, headers and JSON body of a request to any route of `serve`.

    The console's live stream is left out: with admin access it never ends by itself.
    """
    route = draw(st.sampled_from(["events", "legacy", "demo", "page", "ops", "console"]))
    # Valid values often, so that requests get past validation to the use cases.
    domain = draw(st.sampled_from(["scan", "chat", "scan", "other"]) | anything.filter(bool))
    job = draw(st.sampled_from(["job-1", "A-z_0.9:" * 16, "job-1"]) | anything.filter(bool))
    params: dict[str, str] = {}
    headers: dict[str, str] = {}
    if draw(st.integers(0, 3)) == 0:
        params["last_event_id"] = draw(st.one_of(numberish, anything))
    if draw(st.integers(0, 3)) == 0:
        headers["Last-Event-ID"] = draw(st.one_of(numberish, header_text))
    if draw(st.booleans()):
        headers["Authorization"] = draw(st.sampled_from(["Bearer ", "bearer ", "Basic ", ""]))
        headers["Authorization"] += draw(tokens)
    if draw(st.booleans()):
        headers["Cookie"] = draw(
            st.one_of(st.builds(lambda t: f"{COOKIE}={t}", tokens), header_text)
        )
    segments = f"{quote(domain, safe='')}/{quote(job, safe='')}"
    if route == "events":
        return "GET", f"/api/v1/{segments}/events", params, headers, None
    if route == "legacy":
        if draw(st.booleans()):
            params["job_id"] = job
        return "GET", "/api/v1/stream", params, headers, None
    if route == "demo":
        if draw(st.booleans()):
            params["fail"] = draw(st.one_of(st.sampled_from(["true", "0"]), anything))
        return draw(st.sampled_from(["POST", "GET"])), "/api/v1/demo/jobs", params, headers, None
    if route == "page":
        return "GET", "/", params, headers, None
    if route == "ops":
        path = draw(st.sampled_from(["/health", "/ready", "/metrics"]))
        return "GET", path, params, headers, None
    return draw(console_requests(segments, params, headers))


@st.composite
def console_requests(
    draw: st.DrawFn, segments: str, params: dict[str, str], headers: dict[str, str]
) -> Request:
    page = draw(st.sampled_from(["page", "snapshot", "letters", "job", "session", "replay"]))
    if page == "page":
        return "GET", "/console", params, headers, None
    if page == "snapshot":
        return "GET", "/console/api/snapshot", params, headers, None
    if page == "letters":
        for name in ("domain", "reason", "q", "count"):
            if draw(st.booleans()):
                params[name] = draw(st.one_of(numberish, anything))
        return "GET", "/console/api/dead-letters", params, headers, None
    if page == "job":
        return "GET", f"/console/api/jobs/{segments}", params, headers, None
    if page == "session":
        method = draw(st.sampled_from(["POST", "DELETE"]))
        body = draw(st.one_of(json_values, st.builds(lambda t: {"token": t}, tokens)))
        return method, "/console/api/session", params, headers, body
    return "POST", "/console/api/dead-letters/replay", params, headers, draw(replay_bodies)


@pytest.fixture(params=["open", "secured"])
async def gateway(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    for name in [n for n in os.environ if n.startswith(("EVENT_ROUTER_", "REDIS_"))]:
        monkeypatch.delenv(name)  # settings come from the test alone
    overrides: dict[str, object] = {
        "sse_max_wait_s": 0.01,
        "sse_keepalive_s": 0.005,
        "console": True,
    }
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
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
async def test_no_input_gets_a_server_error_or_leaves_a_stream_open(
    gateway: tuple[httpx.AsyncClient, Any],
    request: Request,
) -> None:
    client, app = gateway
    method, path, params, headers, body = request

    raw_headers = {name: value.encode("latin-1") for name, value in headers.items()}
    response = await client.request(
        method,
        path,
        params=params,
        headers=raw_headers,
        json=body if method in {"POST", "DELETE"} else None,
    )

    assert response.status_code in {200, 201, 204, SLASH_REDIRECT} | CLIENT_ERRORS, (
        response.status_code,
        response.text[:200],
    )
    if response.status_code == SLASH_REDIRECT:
        assert not response.headers["location"].endswith("/")
    if response.status_code == 429:
        assert response.headers["Retry-After"]
    assert app.state.client_streams.open_streams("127.0.0.1") == 0
    assert (await client.get("/health")).status_code == 200
