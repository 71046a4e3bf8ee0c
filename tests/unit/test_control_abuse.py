"""The control routes under abuse, on the in-memory gateway with its router and the documented
defaults: bodies the router would not route are refused up front, request ids belong to their
sender, a job's messages are bounded (a cancel always gets through), unknown jobs keep
nothing; and every body a property test makes is either routed or refused in one line."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eco_router.adapters.jwt_authorizer import JwtAuthorizer
from eco_router.application.ports import ControlStore, StateStore
from eco_router.domain.control import ControlLimits
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.resolve import resolve
from tests.contracts.factories import wait_until
from tests.environment import clear_settings
from tests.unit.test_control_http import SECRET, history_stages, start, started

JOB = "job-9"
VIEWER_1 = JwtAuthorizer(SECRET).issue("chat", [JOB], ttl_s=600)
VIEWER_2 = JwtAuthorizer(SECRET).issue("chat", [JOB, "job-other"], ttl_s=600)
ROUTES = [f"/api/v1/chat/{JOB}/cancel", f"/api/v1/chat/{JOB}/input", f"/chat/{JOB}/input"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """A gateway with a JWT secret on the documented defaults, `JOB` started."""
    app, container, manager = await started(jwt_secret=SECRET)
    await start(container, JOB)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
        yield client, container
    await manager.__aexit__(None, None, None)
    container.unwire()


def as_viewer(token: str, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return headers | ({"Idempotency-Key": key} if key else {})


async def control_store(container: Container) -> ControlStore:
    store: ControlStore = await resolve(container.control_store())
    return store


class TestOneValidation:
    @pytest.mark.parametrize("route", ROUTES)
    @pytest.mark.parametrize(
        ("content", "detail"),
        [
            (b'{"a":1e999}', "the body holds 1e999, which is beyond a double"),
            (b'{"a":18446744073709551616}',
             "the body holds the integer 18446744073709551616…, beyond 64 bits"),
            (b'{"a":' + b"[" * 300 + b"]" * 300 + b"}", "the body nests deeper than 64 levels"),
            (b'{"a":"\\ud800"}',
             "the body holds a string with an unpaired surrogate (\\ud800-\\udfff)"),
            (b'{"a":"\xff"}', "the body is not UTF-8"),
        ],
        ids=["beyond a double", "beyond 64 bits", "300 levels", "lone surrogate", "not UTF-8"],
    )  # fmt: skip
    async def test_a_body_the_router_would_not_route_is_422_in_one_line(
        self, gateway: Any, route: str, content: bytes, detail: str
    ) -> None:
        client, container = gateway

        response = await client.post(route, content=content, headers=as_viewer(VIEWER_1, "k"))

        assert (response.status_code, response.json()) == (422, {"detail": detail})
        assert (await (await control_store(container)).messages("chat", JOB)).total == 0

    async def test_a_valid_surrogate_pair_and_a_64_bit_integer_are_routed(
        self, gateway: Any
    ) -> None:
        client, container = gateway
        body = (
            b'{"emoji":"\\ud83d\\ude00","n":18446744073709551615,"deep":'
            + b"[" * 60
            + b"]" * 60
            + b"}"
        )

        response = await client.post(
            f"/api/v1/chat/{JOB}/input", content=body, headers=as_viewer(VIEWER_1, "k")
        )

        assert response.status_code == 202, response.text
        await wait_until(lambda: _has(container, "input_received"), what="the announcement")


async def _has(container: Container, stage: str) -> bool:
    return stage in await history_stages(container, "chat", JOB)


class TestRequestIdsPerSender:
    async def test_another_viewers_request_id_does_not_preempt_mine(self, gateway: Any) -> None:
        client, container = gateway
        theirs = await client.post(
            f"/api/v1/chat/{JOB}/input",
            json={"input": "x"},
            headers=as_viewer(VIEWER_2, f"stop-{JOB}"),
        )

        mine = await client.post(
            f"/api/v1/chat/{JOB}/cancel", headers=as_viewer(VIEWER_1, f"stop-{JOB}")
        )

        assert (theirs.status_code, mine.status_code) == (202, 202)
        assert "idempotent-replayed" not in mine.headers
        assert mine.json()["kind"] == "cancel"
        assert await (await control_store(container)).cancelled("chat", JOB)

    async def test_a_replay_of_the_other_kind_is_refused(self, gateway: Any) -> None:
        client, _ = gateway
        await client.post(
            f"/api/v1/chat/{JOB}/input", json={"input": "x"}, headers=as_viewer(VIEWER_1, "r1")
        )

        again = await client.post(f"/api/v1/chat/{JOB}/cancel", headers=as_viewer(VIEWER_1, "r1"))

        assert again.status_code == 422
        assert again.json() == {"detail": "request id 'r1' was used for input, not cancel"}


class TestBounds:
    async def test_a_flood_of_inputs_is_refused_with_retry_after_and_a_cancel_gets_through(
        self, gateway: Any
    ) -> None:
        client, container = gateway
        statuses = []
        refusals = []
        started_s = time.monotonic()
        for n in range(60):
            response = await client.post(
                f"/api/v1/chat/{JOB}/input",
                json={"input": "x" * 4000},
                headers=as_viewer(VIEWER_1, f"r{n}"),
            )
            statuses.append(response.status_code)
            if response.status_code == 429:
                refusals.append(response)
        elapsed_s = time.monotonic() - started_s
        refused = refusals[0]

        stop = await client.post(f"/api/v1/chat/{JOB}/cancel", headers=as_viewer(VIEWER_1, "stop"))

        # The burst, then what the rate refilled while the posts went on (real time).
        limits = ControlLimits()
        refilled = math.ceil(elapsed_s * limits.rate_per_s)
        assert statuses[: limits.burst] == [202] * limits.burst
        assert limits.burst <= statuses.count(202) <= limits.burst + refilled
        assert set(statuses) == {202, 429}
        assert refused.headers["retry-after"].isdigit()
        assert "retry later" in refused.json()["detail"]
        assert stop.status_code == 202
        page = await (await control_store(container)).messages("chat", JOB)
        assert page.total == statuses.count(202) + 1
        assert page.waiting_bytes <= limits.max_waiting_bytes + 100

    async def test_a_worker_that_keeps_up_never_meets_the_waiting_bound(self) -> None:
        app, container, manager = await started(
            control_max_waiting=2, control_rate_per_s=10_000, control_burst=10_000
        )
        await start(container, JOB)
        store = await control_store(container)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
                for n in range(10):
                    sent = await client.post(
                        f"/api/v1/chat/{JOB}/input",
                        json={"request_id": f"r{n}", "input": n},
                    )
                    assert sent.status_code == 202, sent.text
                    handed = await store.deliver("chat", JOB)
                    for message in handed.messages:
                        await store.acknowledge("chat", JOB, message.message_id)
        finally:
            await manager.__aexit__(None, None, None)
            container.unwire()


class TestUnknownJobs:
    @pytest.mark.parametrize("route", [r.replace(JOB, "job-never") for r in ROUTES])
    async def test_a_message_to_a_job_without_events_is_404_and_keeps_nothing(
        self, gateway: Any, route: str
    ) -> None:
        client, container = gateway
        token = JwtAuthorizer(SECRET).issue("chat", ["*"], ttl_s=60)

        response = await client.post(route, json={"input": "x"}, headers=as_viewer(token, "k"))

        assert response.status_code == 404
        assert response.json() == {"detail": "job job-never has no event yet (unknown, or expired)"}
        assert (await (await control_store(container)).messages("chat", "job-never")).total == 0


# JSON values as a client may send them: any numbers (floats beyond a double included), any
# text (lone surrogates included, written as escapes), deep nesting.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
_bodies = st.one_of(
    st.dictionaries(st.text(max_size=8), _values, min_size=1, max_size=4).map(
        lambda d: json.dumps(d).encode()
    ),
    st.integers(min_value=1, max_value=120).map(
        lambda depth: b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    ),
    st.sampled_from([b'{"a":1e400}', b'{"a":-1e999}', b'{"a":"\\udc00x"}', b"{}", b'{"a":NaN}']),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(_bodies, min_size=1, max_size=6))
def test_every_accepted_body_is_routed_and_every_refusal_is_one_line(bodies: list[bytes]) -> None:
    asyncio.run(_route_bodies(bodies))


async def _route_bodies(bodies: list[bytes]) -> None:
    app, container, manager = await started()
    try:
        await start(container, JOB)
        transport = httpx.ASGITransport(app=app)
        accepted = 0
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
            for n, body in enumerate(bodies):
                response = await client.post(
                    f"/api/v1/chat/{JOB}/input",
                    content=body,
                    headers={"Content-Type": "application/json", "Idempotency-Key": f"r{n}"},
                )
                assert response.status_code in (202, 422), (body, response.text)
                if response.status_code == 422:
                    detail = response.json()["detail"]
                    assert isinstance(detail, str)
                    assert "\n" not in detail
                else:
                    accepted += 1

        states: StateStore = await resolve(container.state_store())

        async def all_routed() -> bool:
            view = await states.view("chat", JOB)
            return sum(json.loads(p)["stage"] == "input_received" for p in view.history) == accepted

        await wait_until(all_routed, what="every accepted body's announcement")
        streams = await resolve(container.memory_streams())
        chat = next(f for f in container.settings().streams if f.domain == "chat")
        assert streams.entries(chat.dead_letter_stream) == []
    finally:
        await manager.__aexit__(None, None, None)
        container.unwire()
