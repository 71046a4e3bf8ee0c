"""How `serve` runs uvicorn: the timeouts and caps that keep slow or hostile clients bounded."""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from eco_router.entrypoints.event_loop import uvicorn_loop
from eco_router.entrypoints.http.frame_writer import FRAME_WRITER, TransportFrameWriter
from eco_router.entrypoints.settings import Settings

log = logging.getLogger(__name__)

# File descriptors the process needs besides client connections (Redis, logs, listener).
_SPARE_FDS = 64


class GatewayConfig(uvicorn.Config):
    """uvicorn's configuration plus the request header read timeout it lacks, and the
    number of connections past which a new one is dropped unanswered."""

    def __init__(
        self, app: Any, *, header_timeout_s: float, max_connections: int, **options: Any
    ) -> None:
        # uvicorn answers 503 once this many are open, counting the one asking.
        super().__init__(
            app,
            http=HeaderTimeoutProtocol,
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


class HeaderTimeoutProtocol(H11Protocol):
    """h11 with a deadline for each request's line and headers.

    uvicorn only times out a connection that is idle between requests (keep-alive); a
    client that connects and sends nothing, or part of a request's headers, would hold its
    connection forever. The deadline starts when the connection opens or a new request's
    first byte arrives, and ends once the headers are complete; past it the connection is
    closed. A connection opened past `drop_above` is closed at once.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._header_timeout_s = float(getattr(config, "header_timeout_s", 10.0))
        self._drop_above: int | None = getattr(config, "drop_above", None)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._drop_above is not None and len(self.connections) > self._drop_above:
            log.debug("dropping a connection: %d open", len(self.connections))
            transport.abort()
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
        cycle = self.cycle
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_timer()
        if self.cycle is not cycle and self.cycle is not None:
            self._offer_frame_writer()

    def _offer_frame_writer(self) -> None:
        """A new request's task is created, not yet run: its scope can still take an
        extension. Only a chunked response (a GET over HTTP/1.1) can take raw chunks."""
        scope = self.cycle.scope
        if scope["method"] == "GET" and scope["http_version"] == "1.1":
            extensions: dict[str, object] = scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[FRAME_WRITER] = TransportFrameWriter(self.cycle, self.transport, self.flow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self._header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            log.debug("closing a connection whose request headers did not arrive in time")
            self.transport.close()


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
