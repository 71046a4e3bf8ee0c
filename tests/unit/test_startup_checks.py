"""The one-line reasons startup errors give for a Redis server that does not answer."""

from __future__ import annotations

import socket

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.entrypoints.startup_checks import cause


def wrapped(error: BaseException, outer: Exception) -> Exception:
    """`outer` raised from `error`, as redis-py raises its errors."""
    try:
        raise outer from error
    except Exception as raised:
        return raised


class TestCause:
    def test_a_refused_connection_says_so(self) -> None:
        refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")

        assert cause(wrapped(refused, RedisConnectionError("Error 111 ..."))) == (
            "connection refused"
        )

    def test_an_unknown_host_says_so(self) -> None:
        unknown = socket.gaierror(-2, "Name or service not known")

        assert cause(wrapped(unknown, RedisConnectionError("Error -2 ..."))) == (
            "name or service not known"
        )

    def test_a_timeout_says_timed_out(self) -> None:
        assert cause(wrapped(TimeoutError(), RedisTimeoutError("Timeout connecting"))) == (
            "timed out"
        )

    def test_anything_else_is_its_first_line(self) -> None:
        error = RedisConnectionError("Protocol error, got 'H' as reply type byte.\nmore")

        assert cause(error) == "Protocol error, got 'H' as reply type byte"
