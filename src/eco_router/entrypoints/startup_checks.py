"""Before a long-running command starts: do the Redis servers answer? One line when not."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.adapters.redis.connection import open_redis, redacted
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.settings import Settings

STARTUP_TIMEOUT_S = 5.0


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
    where = f"the {role} Redis at {redacted(url)}"
    try:
        async with open_redis(
            url, socket_timeout_s=STARTUP_TIMEOUT_S, client_name="eco-router-startup"
        ):
            pass
    except AuthenticationError as error:
        raise StartupFailure(
            f"{where} refused the credentials: {_credentials_problem(url)}",
            ExitCode.CONFIGURATION,
        ) from error
    except (RedisError, OSError) as error:
        raise StartupFailure(
            f"cannot reach {where}: {cause(error)}", ExitCode.UNREACHABLE
        ) from error


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
