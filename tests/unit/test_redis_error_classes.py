"""The Redis error classifier: transient (retry) versus permanent (quarantine), for replies
shaped exactly as redis-py parses them."""

from __future__ import annotations

import asyncio
import socket
import string
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop
from hypothesis import given
from hypothesis import strategies as st
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.adapters.redis.connections.closed_writes import translate_closed_writes
from eco_router.adapters.redis.errors import (
    TRANSIENT_CODES,
    is_transient,
    port_error,
    redis_errors,
)
from eco_router.application.errors import PermanentError, TransientError

KNOWN_PERMANENT = ("WRONGTYPE", "NOPERM", "ERR", "NOGROUP", "EXECABORT", "CROSSSLOT")
# Redirections carry a slot and an address that redis-py parses: they get their own test.
REDIRECTIONS = {"MOVED", "ASK"}
codes = st.sampled_from(sorted(TRANSIENT_CODES - REDIRECTIONS))
other_codes = st.one_of(
    st.sampled_from(KNOWN_PERMANENT),
    st.text(string.ascii_uppercase, min_size=2, max_size=12).filter(
        lambda c: c not in TRANSIENT_CODES
    ),
)
# What follows a code: free text without upper-case words that could be read as a code.
details = st.text(string.ascii_lowercase + string.digits + " .,'>()-_@", max_size=80)
keys = st.text(string.ascii_letters + string.digits + ":{}-_", min_size=1, max_size=40)


def reply_error(line: str) -> Exception:
    """The exception redis-py raises for the error reply `line`."""
    return BaseParser.parse_error(line)


class TestTransient:
    @given(code=codes, detail=details, key=keys)
    def test_every_transient_code_is_retried_whatever_the_text(
        self, code: str, detail: str, key: str
    ) -> None:
        error = reply_error(f"{code} {detail}")

        assert is_transient(error)
        assert isinstance(port_error(error, "command", key=key), TransientError)

    @given(
        code=st.sampled_from(sorted(REDIRECTIONS)),
        slot=st.integers(min_value=0, max_value=16383),
        port=st.integers(min_value=1, max_value=65535),
    )
    def test_a_slot_redirection_redis_py_did_not_follow_is_retried(
        self, code: str, slot: int, port: int
    ) -> None:
        error = reply_error(f"{code} {slot} 127.0.0.1:{port}")

        assert is_transient(error)

    @given(code=codes, detail=details, line=st.integers(min_value=1, max_value=999))
    def test_a_transient_code_inside_a_script_error_is_still_transient(
        self, code: str, detail: str, line: int
    ) -> None:
        error = reply_error(
            f"ERR Error running script (call to f_abc): @user_script:{line}: {code} {detail}"
        )

        assert is_transient(error)

    @given(detail=details)
    def test_connection_and_timeout_errors_are_transient(self, detail: str) -> None:
        for error in (
            RedisConnectionError(detail),
            RedisTimeoutError(detail),
            ConnectionResetError(detail),
            TimeoutError(detail),
        ):
            assert is_transient(error)


async def send_on_a_closed_connection() -> None:
    """Where the observed failure struck: the send of a connection closed meanwhile (no
    writer any more). Nothing is dialled: the send itself fails."""
    closed = Connection(host="127.0.0.1", port=1)
    await closed._send_packed_command([b"PING"])


class TestConnectionClosedUnderACommand:
    """redis-py's asyncio cluster client closes a node's connections on a new slot map (a
    failover) under commands still using them; seen as an AttributeError in a router's XREAD."""

    async def test_sending_on_a_closed_connection_is_a_transient_port_error(self) -> None:
        with pytest.raises(TransientError, match="XREAD: AttributeError"), redis_errors("XREAD"):
            await send_on_a_closed_connection()

    async def test_it_is_transient_in_a_pipelines_reply_too(self) -> None:
        with pytest.raises(AttributeError) as caught:
            await send_on_a_closed_connection()

        assert is_transient(caught.value)
        assert isinstance(port_error(caught.value, "XREADGROUP", key="s"), TransientError)

    def test_an_attribute_error_of_our_own_is_not_taken_for_one(self) -> None:
        def broken() -> None:
            raise AttributeError("'NoneType' object has no attribute 'writelines'")

        with pytest.raises(AttributeError), redis_errors("XREAD"):
            broken()
        with pytest.raises(AttributeError) as caught:
            broken()
        assert not is_transient(caught.value)


async def hung_up_on() -> Connection:
    """A connection its peer reset, seen by the loop (which closed the transport) but not yet
    by redis-py, which still holds the writer. Nothing but a loopback socket is dialled."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        peer, _ = listener.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()
    with pytest.raises(ConnectionResetError):
        await reader.read()
    connection = Connection(host="127.0.0.1", port=1)
    connection._reader, connection._writer = reader, writer
    return connection


def on_uvloop(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


class TestATransportTheLoopClosed:
    """uvloop raises RuntimeError on a write to a closed transport, where asyncio's drops it."""

    def test_writing_on_it_is_a_transient_port_error(self) -> None:
        async def scenario() -> None:
            connection = await hung_up_on()
            with (
                pytest.raises(TransientError, match="SUBSCRIBE: RuntimeError"),
                redis_errors("SUBSCRIBE"),
            ):
                await connection._send_packed_command([b"PING"])

        on_uvloop(scenario)

    def test_a_connection_writing_on_it_raises_redis_pys_connection_error(self) -> None:
        translate_closed_writes()

        async def scenario() -> None:
            connection = await hung_up_on()
            with pytest.raises(RedisConnectionError, match="closed under the write"):
                await connection.send_packed_command([b"PING"], check_health=False)
            assert not connection.is_connected

        on_uvloop(scenario)

    def test_a_runtime_error_of_our_own_is_not_taken_for_one(self) -> None:
        def broken() -> None:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

        with pytest.raises(RuntimeError), redis_errors("SUBSCRIBE"):
            broken()


class TestPermanent:
    @given(code=other_codes, detail=details, key=keys)
    def test_any_other_reply_error_is_permanent_and_names_the_key(
        self, code: str, detail: str, key: str
    ) -> None:
        error = reply_error(f"{code} {detail}")

        translated = port_error(error, "XREADGROUP", key=key)

        assert not is_transient(error)
        assert isinstance(translated, PermanentError)
        assert translated.key == key
        assert translated.cause.startswith("XREADGROUP: ")

    def test_the_errors_of_the_review_are_classified_as_documented(self) -> None:
        oom = "OOM command not allowed when used memory > 'maxmemory'."
        wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value"
        assert is_transient(reply_error(oom))
        assert is_transient(reply_error("LOADING Redis is loading the dataset in memory"))
        assert is_transient(reply_error("BUSY Redis is busy running a script."))
        assert is_transient(reply_error("READONLY You can't write against a read only replica."))
        assert is_transient(reply_error("MASTERDOWN Link with MASTER is down"))
        assert is_transient(reply_error("NOSCRIPT No matching script."))
        assert not is_transient(reply_error(wrongtype))
        assert not is_transient(reply_error("NOPERM this user has no permissions"))
        assert not is_transient(reply_error("ERR unknown command 'XAUTOCLAIM'"))


@given(line=st.text(max_size=120))
def test_classifying_never_fails_whatever_the_reply(line: str) -> None:
    error = reply_error(line)

    assert isinstance(port_error(error, "command"), TransientError | PermanentError)
