"""What a client is told when a dependency fails: a generic line and Retry-After, never the
adapter's text (internal addresses, driver messages), which goes to the log once per episode.
On the in-memory adapters, with a Pub/Sub feed that fails the way redis-py does."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from dependency_injector import providers
from fastapi import FastAPI

from eco_router.application.errors import TransientError
from eco_router.application.ports import EventFeed, FeedSubscription
from eco_router.entrypoints.container import Container, build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.http.public_errors import EpisodeLog
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.settings import load_settings
from tests.environment import clear_settings

INTERNAL = "Error 111 connecting to 127.0.0.1:16392. Connection refused."


class RefusedFeed(EventFeed):
    """A Pub/Sub feed whose server refuses connections, with redis-py's words in the error."""

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        try:
            raise ConnectionError(INTERNAL)
        except ConnectionError as error:
            raise TransientError(f"subscribe sse:events:{job_id}: {error}") from error

    def close_viewers(self) -> None:
        pass


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)


@pytest.fixture
def container() -> Container:
    return build_container(load_settings(), in_memory=True)


@pytest.fixture
async def client(container: Container) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = create_app(container, route=False)
    transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 40_000))
    try:
        async with (
            LifespanManager(app),
            httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http,
        ):
            yield http
    finally:
        container.unwire()


def warnings_naming(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


class TestTheGatewayWhenADependencyIsDown:
    async def test_a_refused_pubsub_is_a_generic_503_and_the_cause_is_logged_once(
        self, container: Container, caplog: pytest.LogCaptureFixture
    ) -> None:
        container.event_feed.override(providers.Object(RefusedFeed()))
        caplog.set_level(logging.WARNING)
        app = create_app(container, route=False)
        transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 40_000))
        try:
            async with (
                LifespanManager(app),
                httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http,
            ):
                answers = [await http.get(f"/api/v1/scan/job-{n}/events") for n in range(3)]
        finally:
            container.unwire()

        assert [a.status_code for a in answers] == [503] * 3
        assert {a.headers["retry-after"] for a in answers} == {"5"}
        assert [a.json() for a in answers] == [{"detail": "pubsub unavailable, retry later"}] * 3
        assert not [a for a in answers if "127.0.0.1" in a.text or "Error 111" in a.text]
        # The cause, for the operator: once for the episode, not once per request.
        assert len(warnings_naming(caplog, INTERNAL)) == 1

    async def test_an_unreadable_state_store_is_named_without_its_cause(
        self, container: Container, client: httpx.AsyncClient
    ) -> None:
        store = await resolve(container.state_store())
        store.available = False

        answer = await client.get("/api/v1/scan/job-1/events")

        assert (answer.status_code, answer.json()) == (
            503,
            {"detail": "state store unavailable, retry later"},
        )
        assert "in-memory" not in answer.text


class TestEpisodeLog:
    def test_a_failure_is_logged_again_only_after_a_quiet_spell(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        now = [0.0]
        episodes = EpisodeLog(quiet_s=30.0, clock=lambda: now[0])
        caplog.set_level(logging.WARNING)

        for at in (0.0, 10.0, 35.0, 64.0, 90.0):  # each within 30 s of the one before
            now[0] = at
            episodes.failed("pubsub", TransientError("first episode"))
        now[0] = 125.0
        episodes.failed("pubsub", TransientError("second episode"))
        episodes.failed("state store", TransientError("another dependency"))

        assert [m.split(": ", 1)[1] for m in warnings_naming(caplog, "unavailable")] == [
            "TransientError: first episode",
            "TransientError: second episode",
            "TransientError: another dependency",
        ]

    def test_passwords_in_the_cause_are_hidden(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.WARNING)

        EpisodeLog().failed("pubsub", TransientError("redis://app:s3cret@redis:6379/0 refused"))

        [message] = warnings_naming(caplog, "unavailable")
        assert "s3cret" not in message
        assert "redis://app:***@redis:6379/0" in message
