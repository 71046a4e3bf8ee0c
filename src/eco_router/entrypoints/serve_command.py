"""`eco-router worker` and `eco-router serve`: the long-running commands and the web stack
they need, imported only when one of them runs (the other commands start without it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Generator
from types import FrameType

import uvicorn

from eco_router.entrypoints import event_loop
from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.discovery import URL_VARIABLES, ServeRecord, announced, discovery_dir
from eco_router.entrypoints.embedded_redis import EmbeddedRedis
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.http.app import create_app, end_streams
from eco_router.entrypoints.http.server_config import server_config
from eco_router.entrypoints.settings import Settings, load_settings
from eco_router.entrypoints.startup_checks import check_redis_servers, listening_socket
from eco_router.entrypoints.startup_log import log_start
from eco_router.entrypoints.worker import serve as serve_router

log = logging.getLogger("eco_router")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_worker(settings: Settings) -> int:
    log_start("worker", settings)
    container = build_container(settings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in _STOP_SIGNALS:
            loop.add_signal_handler(sig, stop.set)
        await check_redis_servers(settings)
        await serve_router(container, stop)

    event_loop.run(run(), settings.event_loop)
    log.info("worker stopped")
    return ExitCode.OK


def run_serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    in_memory: bool,
    embedded_redis: bool,
    route: bool,
    demo: bool,
) -> int:
    sock = listening_socket(
        host, port, elsewhere="serve on a free one: --port {port} (make run PORT={port})"
    )
    try:
        with contextlib.ExitStack() as stack:
            redis: EmbeddedRedis | None = None
            if embedded_redis:
                # Until uvicorn installs its own handlers: SIGTERM unwinds this block, which
                # stops the child Redis (a Ctrl-C does the same as KeyboardInterrupt).
                previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
                stack.callback(signal.signal, signal.SIGTERM, previous)
                redis = stack.enter_context(EmbeddedRedis())
                settings = _on_embedded_redis(redis)
            if in_memory or redis is not None:
                record = ServeRecord(
                    pid=os.getpid(),
                    http_url=f"http://{host}:{sock.getsockname()[1]}/",
                    streams_url=None if redis is None else settings.redis_streams_url,
                    pubsub_url=None if redis is None else settings.pubsub_url,
                    redis_pid=None if redis is None else redis.pid,
                )
                stack.enter_context(announced(record, discovery_dir()))
            return _serve_on(sock, settings, host=host, in_memory=in_memory, route=route, demo=demo)
    finally:
        sock.close()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(ExitCode.OK)


def _on_embedded_redis(redis: EmbeddedRedis) -> Settings:
    """The settings from the environment, but for both servers: the embedded one."""
    ignored = sorted(name for name in os.environ if name.upper() in URL_VARIABLES)
    if ignored:
        log.warning("%s ignored: --embedded-redis serves on its own Redis", ", ".join(ignored))
    log.info(
        "embedded redis-server (pid %s) at %s: nothing persisted, stopped with serve",
        redis.pid,
        redis.url,
    )
    overrides = {"redis_streams_url": redis.url, "redis_pubsub_url": redis.url}
    return load_settings(**overrides)


def _serve_on(
    sock: socket.socket,
    settings: Settings,
    *,
    host: str,
    in_memory: bool,
    route: bool,
    demo: bool,
) -> int:
    if in_memory:
        log.warning("running on in-memory adapters: no Redis is used and nothing is persisted")
    else:
        log_start("serve", settings)
        asyncio.run(check_redis_servers(settings))
    if not route:
        log.info("serving SSE only: events are routed by eco-router worker processes")
    container = build_container(settings, in_memory=in_memory, route=route)
    app = create_app(container, route=route, demo=demo)
    port = int(sock.getsockname()[1])
    if settings.console:
        log.info(
            "open http://%s:%d/ in a browser; the operator console is at http://%s:%d/console",
            host,
            port,
            host,
            port,
        )
    else:
        log.info("open http://%s:%d/ in a browser", host, port)
    config = server_config(app, settings, host=host, port=port)
    server = _GatewayServer(config, before_shutdown=lambda: end_streams(app))
    server.run(sockets=[sock])
    # uvicorn has logged why it could not start.
    return ExitCode.OK if server.started else ExitCode.UNREACHABLE


class _GatewayServer(uvicorn.Server):
    """uvicorn that ends with exit status 0 after a graceful shutdown on SIGTERM or SIGINT.

    uvicorn's own handlers re-raise the signal once it has shut down, so the process would die
    of it (status 143 for SIGTERM) after draining; the worker exits 0, and so should this.
    Open SSE streams are ended as the shutdown begins (`before_shutdown`), once no new
    connection is accepted.
    """

    def __init__(
        self, config: uvicorn.Config, *, before_shutdown: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        await self._before_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                if handler is not None:
                    signal.signal(sig, handler)
