"""Passwords in URLs and tokens in query strings are hidden from everything printed."""

from __future__ import annotations

import logging

import pytest

from eco_router.adapters.redaction import QueryTokenFilter, redact_query, redact_url


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


def test_the_access_log_filter_rewrites_uvicorns_request_line() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/api/v1/stream?job_id=j&token=s3cret", "1.1", 200),
        None,
    )

    assert QueryTokenFilter().filter(record) is True

    assert (
        record.getMessage()
        == '127.0.0.1:5000 - "GET /api/v1/stream?job_id=j&token=*** HTTP/1.1" 200'
    )
