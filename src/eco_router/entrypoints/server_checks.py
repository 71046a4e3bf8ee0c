"""The startup PING of the Redis servers, with one more case told apart: a server that is
not Redis at all (an HTTP port given by mistake) says so instead of a protocol error."""

from __future__ import annotations

import re

from redis.exceptions import InvalidResponse, RedisError

from eco_router.adapters.redaction import redact_url
from eco_router.adapters.redis.connection import open_redis
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.settings import Settings
from eco_router.entrypoints.startup_checks import (
    STARTUP_TIMEOUT_S,
    StartupFailure,
    connection_failure,
)

# redis-py's parsers: `Protocol error, got "H" as reply type byte`.
_REPLY_BYTE = re.compile(r'got "(.)" as reply type byte')
# What an HTTP server's answer starts with: a status line, or an HTML error page.
_HTTP_FIRST_BYTES = frozenset("H<")


async def check_servers(settings: Settings) -> None:
    """PING the streams server, then the Pub/Sub server when it is another one; else the
    one-line `StartupFailure`."""
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
        raise unreachable(role, url, error) from error


def unreachable(role: str, url: str, error: RedisError | OSError) -> StartupFailure:
    """`connection_failure`, but a server that answered outside the Redis protocol is named
    as not a Redis server (exit 3: what was asked for is not there)."""
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
    return connection_failure(role, url, error)
