"""How `serve` runs uvicorn: the timeouts and caps that keep slow or hostile clients bounded."""

from __future__ import annotations

import logging
import math
import resource
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp

from eco_router.entrypoints.event_loop import uvicorn_loop
from eco_router.entrypoints.http.connection_guard import (
    ConnectionGuards,
    ConnectionLayer,
    guarded_protocol,
)
from eco_router.entrypoints.http.request_bounds import ClientConnections, TrustedAddresses
from eco_router.entrypoints.settings import Settings

log = logging.getLogger(__name__)

# File descriptors the process needs besides client connections (Redis, logs, listener).
_SPARE_FDS = 64
# Past the cap, at least this many connections get their 503 before any is closed unanswered.
MIN_REFUSED = 16


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections are served (`cap`), and past how many a new one is closed at
    once, unanswered (`drop_above`); a request on a connection between the two gets 503."""

    cap: int
    drop_above: int

    @classmethod
    def full(cls, cap: int) -> ConnectionLimits:
        """Past the cap a connection is kept just long enough to answer its request with
        503; past twice the cap it is closed at once."""
        return cls(cap, 2 * cap)

    @classmethod
    def narrow(cls, cap: int) -> ConnectionLimits:
        """The least room for 503 answers past the cap."""
        return cls(cap, cap + MIN_REFUSED)


def accept_backlog(max_connections: int) -> int:
    """How many connections wait to be accepted, and how many asyncio accepts in one go
    before any of them can be dropped: kept in proportion to the cap."""
    return max(16, min(2048, max_connections // 4))


def files_needed(limits: ConnectionLimits) -> int:
    """Open files for `limits`: the connections kept, the ones accepted in the few loop
    iterations before a dropped one is closed, and the process's own."""
    return limits.drop_above + 4 * accept_backlog(limits.cap) + _SPARE_FDS


def server_config(app: ASGIApp, settings: Settings, *, host: str, port: int) -> uvicorn.Config:
    """uvicorn's configuration for the gateway, its limits taken from `settings`: its own
    settings where it has them, the rest held by the gateway's connection guard around its
    protocol and by an ASGI layer around `app` (`connection_guard.py`), both given to it
    through its public settings (`http`, the app)."""
    limits = connection_limits(settings.http_max_connections)
    requests = settings.request_limits
    guards = ConnectionGuards(
        header_timeout_s=settings.http_header_timeout_s,
        limits=requests,
        drop_above=limits.drop_above,
    )
    config = uvicorn.Config(
        ConnectionLayer(app, max_body_bytes=requests.max_body_bytes),
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        loop=uvicorn_loop(settings.event_loop),
        http=guarded_protocol(settings.http_parser, guards),
        # The layer returns the app's coroutine instead of being one (see ConnectionLayer). Its
        # requests find their connection in the context their task copies: uvicorn's
        # `reset_contextvars` stays off.
        interface="asgi3",
        # An upgrade would hand the connection to another protocol, past the guard.
        ws="none",
        # uvicorn answers 503 once this many are open, counting the one asking.
        limit_concurrency=limits.cap + 1,
        backlog=accept_backlog(limits.cap),
        # h11 holds a head whole before it parses it; the head's limit is met first.
        h11_max_incomplete_event_size=requests.max_head_bytes,
        timeout_keep_alive=settings.http_idle_timeout_s,
        # Streams get their end as the shutdown begins; writing thousands of ends takes time.
        # (whole seconds, as uvicorn takes them; a fraction rounds up)
        timeout_graceful_shutdown=math.ceil(settings.http_shutdown_timeout_s),
    )
    # The proxies whose X-Forwarded-For uvicorn trusts (FORWARDED_ALLOW_IPS, read by it) carry
    # many clients' connections.
    guards.clients = ClientConnections(
        settings.http_max_connections_per_client, TrustedAddresses(config.forwarded_allow_ips)
    )
    return config


def connection_limits(wanted: int) -> ConnectionLimits:
    """The limits the open-file limit allows for a cap of `wanted`: the soft limit is raised
    as far as the hard limit lets it; if that is not enough, first the room for 503 answers
    past the cap shrinks (down to `MIN_REFUSED`), then the cap is lowered, each with a
    warning, so the process never runs out of descriptors (accept errors) before its limits."""
    full = ConnectionLimits.full(wanted)
    needed = files_needed(full)
    soft = _raise_soft_limit(needed)
    if soft >= needed:
        return full
    room = soft - files_needed(ConnectionLimits(wanted, wanted))
    if room >= MIN_REFUSED:
        log.warning(
            "EVENT_ROUTER_HTTP_MAX_CONNECTIONS=%d needs about %d open files to answer 503 up "
            "to twice the cap but the limit is %d: connections past %d are closed unanswered "
            "(raise the limit with ulimit -n)",
            wanted,
            needed,
            soft,
            wanted + room,
        )
        return ConnectionLimits(wanted, wanted + room)
    allowed = wanted
    while allowed > 1 and files_needed(ConnectionLimits.narrow(allowed)) > soft:
        over = files_needed(ConnectionLimits.narrow(allowed))
        allowed = max(1, min(allowed - 1, allowed * soft // over))
    log.warning(
        "EVENT_ROUTER_HTTP_MAX_CONNECTIONS=%d needs about %d open files but the limit is %d: "
        "capping connections at %d (raise the limit with ulimit -n)",
        wanted,
        needed,
        soft,
        allowed,
    )
    return ConnectionLimits.narrow(allowed)


def _raise_soft_limit(needed: int) -> int:
    """The open-file soft limit, raised toward `needed` as far as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return needed
    raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if raised > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass  # kept as it is: the limits are lowered instead
    return soft
