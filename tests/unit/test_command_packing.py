"""Commands packed by hiredis on asyncio connections: the same bytes as redis-py's packing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import AbstractConnection, Connection
from redis.exceptions import DataError

from eco_router.adapters.redis.connections.command_packing import pack_commands_with_hiredis

# redis-py's own packing, whether or not an earlier test turned hiredis packing on.
PYTHON_PACKING = getattr(
    AbstractConnection.pack_command, "python_packing", AbstractConnection.pack_command
)
ARGUMENT = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False),
    st.binary().map(memoryview),
)
NAME = st.sampled_from(["EVALSHA", "XADD", "CLIENT ID", b"CLIENT UNBLOCK", "set"])


def python_packed(*args: object) -> bytes:
    return b"".join(bytes(part) for part in PYTHON_PACKING(Connection(), *args))  # type: ignore[arg-type]


def packed(*args: object) -> bytes:
    pack_commands_with_hiredis()
    return b"".join(bytes(part) for part in Connection().pack_command(*args))  # type: ignore[arg-type]


class TestHiredisPacking:
    @given(NAME, st.lists(ARGUMENT, max_size=30))
    def test_any_command_packs_to_the_same_bytes(self, name: str, args: list[object]) -> None:
        assert packed(name, *args) == python_packed(name, *args)

    def test_a_large_call_packs_to_the_same_bytes_in_one_piece(self) -> None:
        args = ("EVALSHA", "f" * 40, 4000, *(f"key:{n}" for n in range(4000)), *range(8000))

        parts = Connection().pack_command(*args) if packed("PING") else []

        assert len(parts) == 1
        assert b"".join(parts) == python_packed(*args)

    def test_it_is_on_after_enabling_and_enabling_again_changes_nothing(self) -> None:
        pack_commands_with_hiredis()
        first = AbstractConnection.pack_command
        pack_commands_with_hiredis()

        assert AbstractConnection.pack_command is first
        assert first is not PYTHON_PACKING

    @pytest.mark.parametrize("value", [None, True, object()])
    def test_what_redis_py_refuses_is_refused_the_same_way(self, value: object) -> None:
        with pytest.raises(DataError):
            python_packed("SET", "k", value)
        with pytest.raises(DataError):
            packed("SET", "k", value)
