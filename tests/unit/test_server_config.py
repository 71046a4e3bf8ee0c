"""The limits `serve` gives uvicorn, from the settings."""

from __future__ import annotations

import logging
import os
import resource

import pytest
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eco_router.entrypoints.http.connection_guard import (
    ConnectionGuards,
    ConnectionLayer,
    GuardedConnection,
)
from eco_router.entrypoints.http.request_limits import RequestLimits
from eco_router.entrypoints.http.server_config import (
    MIN_REFUSED,
    ConnectionLimits,
    accept_backlog,
    connection_limits,
    files_needed,
    server_config,
)
from eco_router.entrypoints.settings import ConfigError, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("EVENT_ROUTER_", "REDIS_")):
            monkeypatch.delenv(name)


class TestSettings:
    def test_the_client_bounds_default_to_the_documented_values(self) -> None:
        settings = load_settings()

        assert (
            settings.sse_max_per_client,
            settings.http_max_connections,
            settings.http_header_timeout_s,
            settings.http_idle_timeout_s,
            settings.http_shutdown_timeout_s,
        ) == (32, 1000, 10, 5, 10)

    def test_the_request_bounds_default_to_the_documented_values(self) -> None:
        settings = load_settings()

        assert settings.http_max_connections_per_client == 64
        assert settings.request_limits == RequestLimits(
            max_head_bytes=32 * 1024,
            max_request_line_bytes=8 * 1024,
            max_headers=100,
            max_body_bytes=64 * 1024,
            body_timeout_s=10,
        )

    @pytest.mark.parametrize(
        ("variable", "value"),
        [
            ("EVENT_ROUTER_SSE_MAX_PER_CLIENT", "0"),
            ("EVENT_ROUTER_HTTP_MAX_CONNECTIONS", "0"),
            ("EVENT_ROUTER_HTTP_HEADER_TIMEOUT_S", "0"),
            ("EVENT_ROUTER_HTTP_IDLE_TIMEOUT_S", "soon"),
            ("EVENT_ROUTER_HTTP_SHUTDOWN_TIMEOUT_S", "0"),
            ("EVENT_ROUTER_HTTP_PARSER", "llhttp"),
            ("EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT", "-1"),
            ("EVENT_ROUTER_HTTP_MAX_HEADER_BYTES", "100"),
            ("EVENT_ROUTER_HTTP_MAX_HEADERS", "0"),
            ("EVENT_ROUTER_HTTP_MAX_REQUEST_LINE_BYTES", "8k"),
            ("EVENT_ROUTER_HTTP_MAX_BODY_BYTES", "0"),
            ("EVENT_ROUTER_HTTP_BODY_TIMEOUT_S", "0"),
        ],
    )
    def test_a_bound_that_would_refuse_everything_is_refused(
        self, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
    ) -> None:
        monkeypatch.setenv(variable, value)

        with pytest.raises(ConfigError, match=variable):
            load_settings()

    def test_a_cap_per_address_below_the_streams_per_address_is_one_clear_line(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT", "16")

        with pytest.raises(ConfigError) as refused:
            load_settings()

        [line] = str(refused.value).splitlines()
        assert "EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT must be 0 (no cap)" in line
        assert "EVENT_ROUTER_SSE_MAX_PER_CLIENT" in line

    def test_zero_connections_per_address_is_no_cap(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT", "0")

        assert load_settings().http_max_connections_per_client == 0


def guarded(config: uvicorn.Config) -> type[GuardedConnection]:
    """The protocol class `config` gives uvicorn: the gateway's guard around uvicorn's own."""
    protocol = config.http
    assert isinstance(protocol, type)
    assert issubclass(protocol, GuardedConnection)
    return protocol


def guards_of(config: uvicorn.Config) -> ConnectionGuards:
    return guarded(config).guards


class TestServerConfig:
    def test_the_settings_become_uvicorns_limits_and_the_header_timeout(self) -> None:
        settings = load_settings(
            http_max_connections=50,
            http_header_timeout_s=2.5,
            http_idle_timeout_s=3,
            http_shutdown_timeout_s=25,
        )

        config = server_config(FastAPI(), settings, host="127.0.0.1", port=8000)

        assert guarded(config).server_protocol is HttpToolsProtocol
        assert isinstance(config.app, ConnectionLayer)
        # No upgrade hands a connection to another protocol, past the guard.
        assert config.ws == "none"
        assert guards_of(config).header_timeout_s == 2.5
        assert config.timeout_keep_alive == 3
        assert config.timeout_graceful_shutdown == 25
        # uvicorn refuses once this many are open, the asking one included: 50 are served.
        assert config.limit_concurrency == 51

    def test_the_request_bounds_reach_the_protocols_through_the_config(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.0.0.0/8")
        settings = load_settings(
            http_max_header_bytes=4096,
            http_max_body_bytes=2048,
            http_body_timeout_s=3,
            http_max_connections_per_client=40,
        )

        config = server_config(FastAPI(), settings, host="127.0.0.1", port=8000)

        assert guards_of(config).limits == settings.request_limits
        # h11 would hold a head as long as its own limit: never longer than the gateway's.
        assert config.h11_max_incomplete_event_size == 4096
        clients = guards_of(config).clients
        assert all(clients.admit("192.0.2.7") for _ in range(40))
        assert not clients.admit("192.0.2.7")
        assert clients.admit("10.1.2.3")  # a trusted proxy: never capped

    def test_h11_can_be_chosen_instead_of_httptools(self) -> None:
        settings = load_settings(http_parser="h11")

        config = server_config(FastAPI(), settings, host="127.0.0.1", port=8000)

        assert guarded(config).server_protocol is H11Protocol

    def test_past_twice_the_cap_connections_are_dropped(self) -> None:
        config = server_config(
            FastAPI(), load_settings(http_max_connections=50), host="127.0.0.1", port=8000
        )

        assert guards_of(config).drop_above == 100
        assert config.backlog == accept_backlog(50) == 16


class FileLimits:
    """The process's open-file limits, as `resource` would report and set them."""

    def __init__(self, soft: int, hard: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.soft, self.hard = soft, hard
        monkeypatch.setattr(resource, "getrlimit", lambda _: (self.soft, self.hard))
        monkeypatch.setattr(resource, "setrlimit", self.set)

    def set(self, _: int, limits: tuple[int, int]) -> None:
        soft, hard = limits
        if soft > self.hard or hard > self.hard:
            raise ValueError("not allowed")
        self.soft, self.hard = soft, hard


class TestFileLimits:
    def test_the_soft_limit_is_raised_for_the_cap_when_the_hard_limit_allows(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        limits = FileLimits(1024, 65536, monkeypatch)

        with caplog.at_level(logging.WARNING):
            chosen = connection_limits(1000)

        assert (limits.soft, limits.hard) == (files_needed(ConnectionLimits(1000, 2000)), 65536)
        assert chosen == ConnectionLimits(cap=1000, drop_above=2000)
        assert caplog.records == []

    def test_a_limit_short_of_twice_the_cap_first_narrows_the_503_answers(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        # 10,000 connections under a hard limit of 20,000 open files (twice needs 28,256).
        limits = FileLimits(1024, 20_000, monkeypatch)

        with caplog.at_level(logging.WARNING):
            chosen = connection_limits(10_000)

        assert limits.soft == 20_000
        assert chosen.cap == 10_000
        assert 10_000 + MIN_REFUSED <= chosen.drop_above < 20_000
        assert files_needed(chosen) == 20_000  # all the room there is
        [warning] = caplog.records
        assert f"connections past {chosen.drop_above} are closed unanswered" in (
            warning.getMessage()
        )

    def test_a_limit_that_cannot_be_raised_enough_lowers_the_cap_with_a_warning(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        limits = FileLimits(256, 1024, monkeypatch)

        with caplog.at_level(logging.WARNING):
            chosen = connection_limits(1000)

        cap = chosen.cap
        assert limits.soft == 1024
        assert chosen == ConnectionLimits.narrow(cap)
        # The largest cap that fits.
        assert files_needed(chosen) <= 1024 < files_needed(ConnectionLimits.narrow(cap + 1))
        [warning] = caplog.records
        assert "EVENT_ROUTER_HTTP_MAX_CONNECTIONS=1000" in warning.getMessage()
        assert f"capping connections at {cap}" in warning.getMessage()

    def test_a_limit_high_enough_is_left_alone(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        limits = FileLimits(100_000, 100_000, monkeypatch)

        with caplog.at_level(logging.WARNING):
            chosen = connection_limits(1000)

        assert (limits.soft, chosen) == (100_000, ConnectionLimits(1000, 2000))
        assert caplog.records == []

    def test_a_limit_too_low_for_any_cap_still_leaves_one_connection(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        FileLimits(20, 20, monkeypatch)

        with caplog.at_level(logging.WARNING):
            chosen = connection_limits(1000)

        assert chosen.cap == 1
        assert "capping connections at 1" in caplog.records[0].getMessage()
