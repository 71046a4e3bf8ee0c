"""A write on a connection closed under it fails as redis-py's ConnectionError, as one on a
connection closed before it does.

redis-py checks that a connection is open, then writes after an await (the `wait_for` it
wraps each send in when a socket timeout is set, a health check PING). A PubSub's connection
is shared by its reader and every (UN)SUBSCRIBE, a cluster node's by every command and the
client that closes them all on a new slot map: when the peer hangs up, the reader's reconnect
disconnects the connection (its `_writer` becomes None) while another task is between that
check and its write (AttributeError: 'NoneType' object has no attribute 'writelines'); a
write that comes first finds the transport the event loop closed on the hang-up (uvloop:
RuntimeError "unable to perform operation on <TCPTransport closed=True>"). redis-py
translates only OSError into ConnectionError, so these reach the caller raw, past the retry
that would have reconnected and past every handler that knows a lost connection
(redis/redis-py#4287, not fixed in 8.1). Translated here, at the write, they take redis-py's
own way for a lost connection: its retry reconnects, a cluster client learns the new slot
map, and a caller sees ConnectionError.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from eco_router.adapters.redis.errors import CLOSED_ERRORS, closed_under_command

Send = Callable[..., Coroutine[Any, Any, None]]


def _translated(send: Send) -> Send:
    async def send_packed_command(
        self: AbstractConnection,
        command: bytes | str | Iterable[bytes],
        check_health: bool = True,
    ) -> None:
        try:
            await send(self, command, check_health)
        except CLOSED_ERRORS as error:
            if not closed_under_command(error):
                raise
            # redis-py has disconnected it already, as after any failed write.
            raise RedisConnectionError(
                f"Error while writing to {self._host_error()}: the connection was closed "
                f"under the write ({type(error).__name__}: {error})"
            ) from error

    send_packed_command.redis_send = send  # type: ignore[attr-defined]
    return send_packed_command


def translate_closed_writes() -> None:
    """Make every asyncio connection's write on a closed connection raise ConnectionError;
    idempotent."""
    current = AbstractConnection.send_packed_command
    if hasattr(current, "redis_send"):
        return
    AbstractConnection.send_packed_command = _translated(current)  # type: ignore[method-assign]
