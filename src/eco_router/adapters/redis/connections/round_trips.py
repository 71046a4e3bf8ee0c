"""Running a pipeline's commands in one round trip: on a connection kept for the caller, or
through the client's pool (a Redis Cluster)."""

from __future__ import annotations

import asyncio
from asyncio import CancelledError
from collections.abc import Sequence
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.adapters.redis.connections.connection import RedisClient

Arguments = Sequence[str | int | bytes]


class RoundTrips(Protocol):
    """How an adapter sends the commands of its hot path."""

    async def execute(self, pipe: Any) -> list[Any]:
        """What `pipe.execute(raise_on_error=False)` returns: each command's reply, or the
        error the server answered for it."""
        ...

    async def call_script(self, script: AsyncScript, keys: Sequence[str], args: Arguments) -> Any:
        """`script(keys=keys, args=args)`: by its digest, loaded again if the server lost it."""
        ...


def round_trips(client: RedisClient) -> RoundTrips:
    """A kept connection for one server's (or a Sentinel group master's) client; the pool for
    a Redis Cluster's, whose commands go to the node owning their keys."""
    if isinstance(client, RedisCluster):
        return PooledRoundTrips()
    return HeldConnection(client)


class PooledRoundTrips:
    """Each round trip checks a connection out of the client's pool, as redis-py does."""

    async def execute(self, pipe: Any) -> list[Any]:
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def call_script(self, script: AsyncScript, keys: Sequence[str], args: Arguments) -> Any:
        return await script(keys=keys, args=args)


class HeldConnection:
    """One connection taken from a client's pool and kept, for a caller that sends one round
    trip at a time (the router's read, apply and publish).

    Through the pool a pipeline costs the client about twice its round trip (a checkout that
    probes the socket, per-command observability hooks, the release). Here the commands a
    redis-py pipeline queued are packed and sent on the kept connection, with the
    connection's own retry (as the pipeline would); each reply is read straight from the
    connection and shaped by the client's callback for it, as redis-py's parse_response
    would, and a lone script call builds no pipeline. A round trip interrupted midway (a
    timeout, a cancellation, a dropped connection) disconnects it, so no late reply is read
    as the next one's; the next round trip connects again (behind Sentinel: to the
    master of the moment). The client's `aclose()` closes it.

    The connection's socket timeout bounds the whole round trip, once, instead of redis-py
    arming one per reply and running each send in a task of its own; and it does no health
    check PING (a dead connection fails the round trip, whose retry connects again). Each of
    those asked the loop for the time, and Python 3.11's `get_running_loop()` makes a
    `getpid()` system call: together about a seventh of a paced router's CPU.
    """

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._connection: AbstractConnection | None = None
        self._timeout_s: float | None = None
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Per command name, how its reply is read (`_shape`).
        self._shapes: dict[str, Any] = {}

    async def execute(self, pipe: Any) -> list[Any]:
        commands = pipe.command_stack
        if not commands:
            return []
        return await self._execute(commands, pipe)

    async def _execute(self, commands: list[Any], parser: Redis) -> list[Any]:
        async with self._lock:
            connection = self._connection or await self._take_connection()
            loop = self._loop
            if loop is None or not connection.is_connected:
                # A connection works in the loop it was opened in: asked again only then.
                loop = self._loop = asyncio.get_running_loop()
            replies: list[Any] = await connection.retry.call_with_retry(
                lambda: self._round_trip(connection, parser, commands, loop),
                lambda _error: connection.disconnect(),
            )
            return replies

    async def _round_trip(
        self,
        connection: AbstractConnection,
        parser: Redis,
        commands: list[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> list[Any]:
        timeout_s = self._timeout_s
        deadline = None if timeout_s is None else _Deadline(loop, timeout_s)
        try:
            try:
                if not connection.is_connected:
                    # Its own connect(): behind Sentinel it asks for the master of the moment,
                    # where sending on a closed connection would reconnect to the last address.
                    await connection.connect()  # type: ignore[no-untyped-call]
                # The chunks each command packs to, written together (redis-py's pack_commands
                # only joins them again into larger buffers first).
                packed = [chunk for args, _ in commands for chunk in connection.pack_command(*args)]
                await connection.send_packed_command(packed, check_health=False)
                callbacks = parser.response_callbacks
                replies: list[Any] = []
                for args, options in commands:
                    name = args[0]
                    try:
                        shape = _shape(name, options, callbacks, self._shapes)
                        if shape is _PARSED:
                            reply = await parser.parse_response(connection, name, **options)  # type: ignore[arg-type]
                        else:
                            reply = await connection.read_response()
                            if shape is not None:
                                reply = shape(reply)
                                if hasattr(reply, "__await__"):
                                    reply = await reply
                        replies.append(reply)
                    except ResponseError as error:
                        replies.append(error)
            finally:
                if deadline is not None:
                    deadline.disarm()
        except BaseException as error:
            await connection.disconnect(nowait=True)
            if deadline is not None and deadline.expired() and type(error) is CancelledError:
                raise RedisTimeoutError(f"no reply within {timeout_s} s") from None
            raise
        if deadline is not None:
            deadline.expired()
        return replies

    async def _take_connection(self) -> AbstractConnection:
        pool = self._client.connection_pool
        connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
        self._timeout_s = connection.socket_timeout
        connection.socket_timeout = None
        connection.health_check_interval = 0
        self._connection = connection
        return connection

    async def call_script(self, script: AsyncScript, keys: Sequence[str], args: Arguments) -> Any:
        reply = await self._evalsha(script, keys, args)
        if isinstance(reply, NoScriptError):
            # A server restarted or failed over since the script was last loaded.
            await self._client.script_load(script.script)
            reply = await self._evalsha(script, keys, args)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _evalsha(self, script: AsyncScript, keys: Sequence[str], args: Arguments) -> Any:
        # The command as a pipeline would queue it, without building one for a single command.
        command: tuple[tuple[Any, ...], dict[str, Any]] = (
            ("EVALSHA", script.sha, len(keys), *keys, *args),
            {},
        )
        (reply,) = await self._execute([command], self._client)
        return reply


class _Deadline:
    """What `asyncio.timeout()` does for a round trip (cancel its task once the time is up,
    tell that cancellation from the caller's), given the loop: it asks for the running loop
    three times, and Python 3.11's `get_running_loop()` makes a `getpid()` system call."""

    __slots__ = ("_cancelling", "_fired", "_handle", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a round trip runs in a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._fired = False
        self._handle = loop.call_at(loop.time() + timeout_s, self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._task.cancel()

    def disarm(self) -> None:
        self._handle.cancel()

    def expired(self) -> bool:
        """Whether it cancelled the task, and no one else did: its own cancellation is taken
        back, once, as `asyncio.timeout()` takes back its own."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._cancelling


# Commands whose reply redis-py's pipeline reads with bookkeeping of its own (WATCH state).
_STATEFUL = frozenset({"WATCH", "UNWATCH", "EXEC", "DISCARD"})
# A reply read through redis-py's parse_response, as a pipeline reads it.
_PARSED = object()


def _shape(name: str, options: dict[str, Any], callbacks: Any, known: dict[str, Any]) -> Any:
    """How `name`'s reply is read: `_PARSED` for redis-py's parse_response (an option that
    changes the reading, WATCH state), else straight from the connection and given to the
    client's callback for it (None: as it came). Which is what parse_response would do, less
    two layers of calls, a case-insensitive lookup and an ABC isinstance check per reply."""
    if options and options.keys() - {"keys"}:
        return _PARSED
    shape = known.get(name, _PARSED)
    if shape is _PARSED:
        shape = known[name] = _PARSED if name.upper() in _STATEFUL else callbacks.get(name)
    return shape
