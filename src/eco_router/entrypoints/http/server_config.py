"""How `serve` runs uvicorn: the timeouts and caps that keep slow or hostile clients bounded."""

from __future__ import annotations

import logging
import resource
from typing import Any

import uvicorn

from eco_router.entrypoints.event_loop import uvicorn_loop
from eco_router.entrypoints.http.protocols import HttpParserChoice, http_protocol
from eco_router.entrypoints.settings import Settings

log = logging.getLogger(__name__)

# File descriptors the process needs besides client connections (Redis, logs, listener).
_SPARE_FDS = 64


class GatewayConfig(uvicorn.Config):
    """uvicorn's configuration plus the request header read timeout it lacks, and the
    number of connections past which a new one is dropped unanswered."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout_s: float,
        max_connections: int,
        parser: HttpParserChoice = "httptools",
        **options: Any,
    ) -> None:
        # uvicorn answers 503 once this many are open, counting the one asking.
        super().__init__(
            app,
            http=http_protocol(parser),
            limit_concurrency=max_connections + 1,
            backlog=accept_backlog(max_connections),
            **options,
        )
        self.header_timeout_s = header_timeout_s
        self.drop_above = hard_connection_limit(max_connections)


def hard_connection_limit(max_connections: int) -> int:
    """Past the cap a connection is kept just long enough to answer its request with 503;
    past twice the cap it is closed at once."""
    return 2 * max_connections


def accept_backlog(max_connections: int) -> int:
    """How many connections wait to be accepted, and how many asyncio accepts in one go
    before any of them can be dropped: kept in proportion to the cap."""
    return max(16, min(2048, max_connections // 4))


def files_needed(max_connections: int) -> int:
    """Open files for the cap: the connections kept, the ones accepted in the few loop
    iterations before a dropped one is closed, and the process's own."""
    return hard_connection_limit(max_connections) + 4 * accept_backlog(max_connections) + _SPARE_FDS


def server_config(app: Any, settings: Settings, *, host: str, port: int) -> GatewayConfig:
    """The uvicorn configuration of the gateway, its limits taken from `settings`."""
    return GatewayConfig(
        app,
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        loop=uvicorn_loop(settings.event_loop),
        # Streams get their end as the shutdown begins; writing thousands of ends takes time.
        timeout_graceful_shutdown=settings.http_shutdown_timeout_s,
        header_timeout_s=settings.http_header_timeout_s,
        parser=settings.http_parser,
        timeout_keep_alive=settings.http_idle_timeout_s,
        max_connections=connection_cap(settings.http_max_connections),
    )


def connection_cap(wanted: int) -> int:
    """The cap the open-file limit allows: the soft limit is raised as far as the hard limit
    lets it for `wanted`; if that is not enough the cap is lowered, with a warning, so the
    process never runs out of descriptors (accept errors) before it reaches its cap."""
    needed = files_needed(wanted)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if raised > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass  # kept as it is: the cap is lowered instead
    if soft >= needed:
        return wanted
    allowed = wanted
    while allowed > 1 and files_needed(allowed) > soft:
        allowed = max(1, min(allowed - 1, allowed * soft // files_needed(allowed)))
    log.warning(
        "EVENT_ROUTER_HTTP_MAX_CONNECTIONS=%d needs about %d open files but the limit is %d: "
        "capping connections at %d (raise the limit with ulimit -n)",
        wanted,
        needed,
        soft,
        allowed,
    )
    return allowed
