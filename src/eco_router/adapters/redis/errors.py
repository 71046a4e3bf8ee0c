"""Translation of redis-py errors into port errors: the one place they are classified."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from typing import Literal

from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.application.errors import PermanentError, TransientError

TRANSIENT_REDIS_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    OutOfMemoryError,
    ClusterDownError,  # MASTERDOWN too
    # A cluster client that reaches no node, or finds a slot no node serves (mid-failover).
    RedisClusterException,
    NoScriptError,  # a script flushed from the server is loaded again on the next call
    ConnectionError,
    TimeoutError,
    OSError,
)

_REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, *TRANSIENT_REDIS_ERRORS)

# Error codes that describe the server's condition, not the command: the same command
# succeeds once the server has loaded, finished its script, freed memory or failed over.
TRANSIENT_CODES = frozenset(
    {
        "LOADING",
        "BUSY",
        "TRYAGAIN",
        "OOM",
        "READONLY",
        "MASTERDOWN",
        "CLUSTERDOWN",
        "NOSCRIPT",
        "NOREPLICAS",
        "UNBLOCKED",
        # A slot moved (resharding, failover): the client follows once it knows the new map.
        "MOVED",
        "ASK",
    }
)

# A script's error is reported as "... @user_script:12: OOM command not allowed ..." by
# older servers; newer ones keep the code first. Either way the code is an upper-case word
# at the start or after a colon.
_CODE = re.compile(r"(?:^|:\s*)([A-Z][A-Z_]+)\b")


def error_code(error: ResponseError) -> str:
    """The Redis error code of a reply error (`WRONGTYPE`, `OOM`, ...), `ERR` when none."""
    status: object = getattr(error, "status_code", None)
    codes: list[str] = _CODE.findall(str(error))
    if isinstance(status, str) and status:
        codes.insert(0, status)
    for code in codes:
        if code in TRANSIENT_CODES:
            return code
    return codes[0] if codes else "ERR"


# Where redis-py reads and writes a connection's socket.
_CONNECTION_MODULES = ("redis.connection", "redis.asyncio.connection", "redis._parsers")
# The event loop's own code, which redis-py's socket I/O calls into: asyncio's streams and
# transports, uvloop's (whose Cython frames are named after their module too).
_LOOP_MODULES = ("asyncio.", "uvloop")
# What a stream, its transport or redis-py's own attributes raise once closed: see below.
CLOSED_ERRORS: tuple[type[Exception], ...] = (AttributeError, RuntimeError, TypeError)
_TRANSLATED = _REDIS_ERRORS + CLOSED_ERRORS


def closed_under_command(error: BaseException) -> bool:
    """Whether `error` is redis-py failing on a connection closed while a command used it.

    Connections are shared by tasks: a PubSub's by its reader and every SUBSCRIBE or
    UNSUBSCRIBE, a cluster node's by the client that closes them all when it learns a new
    slot map. redis-py checks that a connection is open, then writes after an await (the
    `wait_for` it wraps each send in when a socket timeout is set, a health check): another
    task that disconnected it meanwhile left `_writer` None (AttributeError: 'NoneType' object
    has no attribute 'writelines'). A transport the event loop closed (the peer hung up) before
    redis-py's reader noticed fails the write itself: uvloop raises RuntimeError ("unable to
    perform operation on <TCPTransport closed=True>"), CPython 3.12+ a TypeError (its
    `writelines` calls a cleared `_write_ready`). redis-py turns only OSError into its
    ConnectionError, so these pass it raw (redis/redis-py#4287).

    Recognised by where they were raised, not by their text: in redis-py's socket I/O
    itself, or in the event loop's code it called, with nothing else in between.
    """
    if not isinstance(error, CLOSED_ERRORS):
        return False
    in_connection = False
    below: list[str] = []  # the modules of the frames below redis-py's innermost one
    frame = error.__traceback__
    while frame is not None:
        module = str(frame.tb_frame.f_globals.get("__name__", ""))
        if module.startswith(_CONNECTION_MODULES):
            in_connection, below = True, []
        else:
            below.append(module)
        frame = frame.tb_next
    if not in_connection:
        return False
    if not below:
        # On its own reader or writer, gone: only an AttributeError means that.
        return isinstance(error, AttributeError)
    return all(module.startswith(_LOOP_MODULES) for module in below)


def is_transient(error: BaseException) -> bool:
    """Whether retrying the same command later may succeed without anyone fixing anything."""
    if isinstance(error, TRANSIENT_REDIS_ERRORS) or closed_under_command(error):
        return True
    if isinstance(error, ResponseError):
        return error_code(error) in TRANSIENT_CODES
    return False


def port_error(
    error: Exception,
    what: str,
    *,
    key: str = "",
    transient_type: type[TransientError] = TransientError,
) -> TransientError | PermanentError:
    """The port error `error` stands for: transient, or permanent for `key`."""
    text = f"{type(error).__name__}: {error}"
    if is_transient(error):
        return transient_type(f"{what}: {text}")
    return PermanentError(key, f"{what}: {text}")


def redis_errors(
    what: str, *, key: str = "", error_type: type[TransientError] = TransientError
) -> AbstractContextManager[None]:
    """Re-raise redis errors as port errors naming the operation (and the key, if one)."""
    return _Translating(what, key, error_type)


class _Translating:
    """`redis_errors`' context: a class, entered around every round trip of the router's
    batches, where a generator-based one builds and runs a generator each time."""

    __slots__ = ("_error_type", "_key", "_what")

    def __init__(self, what: str, key: str, error_type: type[TransientError]) -> None:
        self._what = what
        self._key = key
        self._error_type = error_type

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> Literal[False]:
        if not isinstance(error, _TRANSLATED):
            return False
        if not isinstance(error, _REDIS_ERRORS) and not closed_under_command(error):
            return False
        raise port_error(
            error, self._what, key=self._key, transient_type=self._error_type
        ) from error
