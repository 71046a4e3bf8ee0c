"""Passwords in URLs and tokens in query strings are hidden from everything printed."""

from __future__ import annotations

import logging
import time
from typing import Any

import jwt
import pytest
from uvicorn.protocols.utils import get_path_with_query_string

from eco_router.adapters.redaction import (
    QueryTokenFilter,
    redact_query,
    redact_request_target,
    redact_url,
)
from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.settings import load_settings

TOKEN = jwt.encode(
    {"domain": "scan", "jobs": ["j1"], "exp": int(time.time()) + 60},
    "a-test-secret-that-is-long-enough-for-hs256",
    algorithm="HS256",
)
# Shorter than a job id may be: hidden for its shape, not its length.
SHORT_TOKEN = jwt.encode({"jobs": ["j"]}, "a-test-secret-that-is-long-enough-for-hs256")
assert len(SHORT_TOKEN) < 128


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://router:s3cret@redis:6379/0", "redis://router:***@redis:6379/0"),
        ("rediss://:s3cret@redis:6380/1", "rediss://***@redis:6380/1"),
        ("redis://s3cret@redis:6379", "redis://***@redis:6379"),
        ("redis://router:p@ss:w@rd@redis/0", "redis://router:***@redis/0"),
        ("redis://redis:6379/0?password=s3cret&db=2", "redis://redis:6379/0?password=***&db=2"),
        ("unix:///run/redis.sock?password=s3cret", "unix:///run/redis.sock?password=***"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        ("redis://redis/0?note=a@b", "redis://redis/0?note=a@b"),
    ],
)
def test_urls_are_printed_without_their_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_token_parameters_of_any_name_are_hidden_and_others_kept() -> None:
    line = "/events?job_id=j-1&token=a.b.c&access_token=x&refresh_token=y&api_key=z&last_event_id=5"

    assert redact_query(line) == (
        "/events?job_id=j-1&token=***&access_token=***&refresh_token=***&api_key=***"
        "&last_event_id=5"
    )


def access_record(target: str) -> logging.LogRecord:
    """A request line as uvicorn's access logger records it."""
    return logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", target, "1.1", 200),
        None,
    )


def uvicorn_target(path: str, query: str = "") -> str:
    """What uvicorn logs of a request for `path` (as the server decoded it) and `query`."""
    scope: Any = {"path": path, "query_string": query.encode()}
    return get_path_with_query_string(scope)


def test_the_access_log_filter_rewrites_uvicorns_request_line() -> None:
    record = access_record(uvicorn_target("/api/v1/stream", "job_id=j&token=s3cret"))

    assert QueryTokenFilter().filter(record) is True

    assert (
        record.getMessage()
        == '127.0.0.1:5000 - "GET /api/v1/stream?job_id=***&token=*** HTTP/1.1" 200'
    )


class TestAccessLog:
    @pytest.mark.parametrize(
        ("query", "shown"),
        [
            # The name percent-encoded: the server reads `token`.
            (f"tok%65n={TOKEN}", "token=***"),
            (f"%74%6F%6B%65%6E={TOKEN}&job_id=j", "token=***&job_id=***"),
            (f"job=scan:{TOKEN}&job=scan:j2", "job=***&job=***"),
            (f"last_event_id={TOKEN}", "last_event_id=***"),
            ("last_event_id=abc.1,2&job=scan%3Aj1", "last_event_id=***&job=***"),
            # A token sent as a name, with or without a value.
            (TOKEN, "***"),
            (f"{TOKEN}=1&x", "***=***&x"),
            # A name that would break the log line or hide in it.
            ("%0Aforged%20line=1", "***=***"),
        ],
    )
    def test_no_query_value_is_shown_and_names_are_decoded(self, query: str, shown: str) -> None:
        assert redact_request_target(uvicorn_target("/api/v1/streams", query)) == (
            f"/api/v1/streams?{shown}"
        )

    @pytest.mark.parametrize(
        "path",
        [
            f"/api/v1/scan/{SHORT_TOKEN}/events",
            f"/api/v1/scan/Bearer {SHORT_TOKEN}/events",
            f"/api/v1/{SHORT_TOKEN}/job-1/events",
            f"/api/v1/scan/{'x' * 129}/events",
        ],
    )
    def test_a_path_segment_that_may_hold_a_token_is_hidden(self, path: str) -> None:
        shown = redact_request_target(uvicorn_target(path))

        assert SHORT_TOKEN not in shown
        assert "xxxx" not in shown
        assert shown.endswith("/events")
        assert "***" in shown

    def test_a_token_in_a_path_segment_is_hidden_however_it_is_encoded(self) -> None:
        encoded = SHORT_TOKEN.replace(".", "%2E").replace("e", "%65")

        assert redact_request_target(f"/api/v1/scan/{encoded}/events") == (
            "/api/v1/scan/***/events"
        )

    @pytest.mark.parametrize(
        "path",
        ["/api/v1/scan/job-1/events", f"/api/v1/chat/{'j' * 128}/events", "/health", "/"],
    )
    def test_paths_of_job_ids_are_shown_whole(self, path: str) -> None:
        assert redact_request_target(uvicorn_target(path)) == path

    def test_the_app_installs_the_filter_on_uvicorns_access_log(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        container = build_container(load_settings(), in_memory=True)
        create_app(container)
        container.unwire()
        access = logging.getLogger("uvicorn.access")

        with caplog.at_level(logging.INFO, logger="uvicorn.access"):
            access.handle(
                access_record(uvicorn_target(f"/api/v1/scan/{TOKEN}/events", f"tok%65n={TOKEN}"))
            )

        assert TOKEN not in caplog.text
        assert SHORT_TOKEN not in caplog.text
        assert "/api/v1/scan/***/events?token=***" in caplog.text
