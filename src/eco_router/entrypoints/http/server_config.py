"""How `serve` runs uvicorn: the timeouts and caps that keep slow or hostile clients bounded."""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from eco_router.entrypoints.settings import Settings

log = logging.getLogger(__name__)

# File descriptors the process needs besides client connections (Redis, logs, listener).
_SPARE_FDS = 64


class GatewayConfig(uvicorn.Config):
    """uvicorn's configuration plus the request header read timeout it lacks."""

    def __init__(self, app: Any, *, header_timeout_s: float, **options: Any) -> None:
        super().__init__(app, http=HeaderTimeoutProtocol, **options)
        self.header_timeout_s = header_timeout_s


class HeaderTimeoutProtocol(H11Protocol):
    """h11 with a deadline for each request's line and headers.

    uvicorn only times out a connection that is idle between requests (keep-alive); a
    client that connects and sends nothing, or part of a request's headers, would hold its
    connection forever. The deadline starts when the connection opens or a new request's
    first byte arrives, and ends once the headers are complete; past it the connection is
    closed.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._header_timeout_s = float(getattr(config, "header_timeout_s", 10.0))
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_timer()

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
    warn_if_fds_are_short(settings.http_max_connections)
    return GatewayConfig(
        app,
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        # Open SSE streams would hold a graceful shutdown forever: give them a few seconds.
        timeout_graceful_shutdown=3,
        header_timeout_s=settings.http_header_timeout_s,
        timeout_keep_alive=settings.http_idle_timeout_s,
        # uvicorn answers 503 once this many connections are open, counting the one asking.
        limit_concurrency=settings.http_max_connections + 1,
    )


def warn_if_fds_are_short(max_connections: int) -> None:
    """A cap above the process's file descriptor limit would run out of descriptors first."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and max_connections + _SPARE_FDS > soft:
        log.warning(
            "EVENT_ROUTER_HTTP_MAX_CONNECTIONS=%d is above what the open-file limit (%d) "
            "allows; raise the limit (ulimit -n) or lower the cap",
            max_connections,
            soft,
        )
