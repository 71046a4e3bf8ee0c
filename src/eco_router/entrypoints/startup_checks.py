"""Before a command starts: do the Redis servers answer, is the port free? One line when not."""

from __future__ import annotations

import errno
import os
import re
import socket
from urllib.parse import urlsplit

from redis.exceptions import AuthenticationError, InvalidResponse, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.adapters.redaction import redact_url
from eco_router.adapters.redis.connections.connection import open_redis
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.settings import Settings

STARTUP_TIMEOUT_S = 5.0
# redis-py's parsers: `Protocol error, got "H" as reply type byte`.
_REPLY_BYTE = re.compile(r'got "(.)" as reply type byte')
# What an HTTP server's answer starts with: a status line, or an HTML error page.
_HTTP_FIRST_BYTES = frozenset("H<")


class StartupFailure(Exception):
    """The process cannot start; the message is one line, `exit_code` the documented status."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = exit_code


async def check_redis_servers(settings: Settings) -> None:
    """PING the streams server, then the Pub/Sub server when it is another one."""
    await _ping("streams", settings.redis_streams_url)
    if settings.pubsub_url != settings.redis_streams_url:
        await _ping("Pub/Sub", settings.pubsub_url)


async def _ping(role: str, url: str) -> None:
    try:
        async with open_redis(
            url, socket_timeout_s=STARTUP_TIMEOUT_S, client_name="eco-router-startup"
        ):
            pass
    except (RedisError, OSError) as error:
        raise connection_failure(role, url, error) from error


def connection_failure(role: str, url: str, error: RedisError | OSError) -> StartupFailure:
    """Why the first command on the `role` server ("streams", "Pub/Sub") failed, in one line.

    Refused credentials and a database the server does not have are configuration (exit 2);
    anything else means the server is out of reach (exit 3), a server that answered outside
    the Redis protocol (an HTTP port given by mistake) being named as not a Redis server.
    """
    if isinstance(error, InvalidResponse):
        found = _REPLY_BYTE.search(str(error))
        like = (
            "it answered like an HTTP server"
            if found and found.group(1) in _HTTP_FIRST_BYTES
            else f"it answered: {str(error).strip()}"
        )
        return StartupFailure(
            f"the {role} server at {redact_url(url)} is not a Redis server ({like})",
            ExitCode.UNREACHABLE,
        )
    where = f"the {role} Redis at {redact_url(url)}"
    if isinstance(error, AuthenticationError):
        return StartupFailure(
            f"{where} refused the credentials: {_credentials_problem(url)}",
            ExitCode.CONFIGURATION,
        )
    if isinstance(error, ResponseError) and "DB index is out of range" in str(error):
        return StartupFailure(
            f"{where} has no such database (DB index is out of range; the server's "
            "`databases` setting is lower)",
            ExitCode.CONFIGURATION,
        )
    return StartupFailure(f"cannot reach {where}: {cause(error)}", ExitCode.UNREACHABLE)


def listening_socket(host: str, port: int, *, elsewhere: str = "") -> socket.socket:
    """A socket bound to `host`:`port` (0: any free port), before anything else starts;
    `elsewhere` says how to pick another port when this one is taken (`{port}`: a free one).

    uvicorn would find the port taken only after the app and the router had started, log
    its own lines and exit; binding first makes that one line and exit 3.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        raise StartupFailure(
            f"cannot listen on {host}:{port}: {cause(error)}", ExitCode.UNREACHABLE
        ) from error
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as error:
        sock.close()
        hint = ""
        if error.errno == errno.EADDRINUSE and elsewhere:
            hint = "; " + elsewhere.format(port=free_port(host))
        raise StartupFailure(
            f"cannot listen on {host}:{port}: {cause(error)}{hint}", ExitCode.UNREACHABLE
        ) from error
    return sock


def free_port(host: str) -> int:
    """A port free on `host` right now, to suggest in place of a taken one."""
    try:
        with socket.create_server((host, 0)) as probe:
            return int(probe.getsockname()[1])
    except OSError:
        return 8010


def cause(error: BaseException) -> str:
    """A short reason for a failed connection: `connection refused`, `timed out`, ..."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return str(seen.strerror).lower()
        if isinstance(seen, OSError) and isinstance(seen.errno, int) and seen.errno > 0:
            return os.strerror(seen.errno).lower()
        if isinstance(seen, TimeoutError | RedisTimeoutError):
            return "timed out"
        seen = seen.__cause__ or seen.__context__
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return first_line.rstrip(".")


def _credentials_problem(url: str) -> str:
    if urlsplit(url).password is None:
        return "it needs a password and the URL has none"
    return "wrong user name or password, or the user is disabled"
