"""The worker process: the router plus a small server of probes and metrics (nothing else)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator

import uvicorn
from dependency_injector import providers

from eco_router.entrypoints.container import Container
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.gc_tuning import settle_garbage_collector
from eco_router.entrypoints.http.app import create_ops_app
from eco_router.entrypoints.runner import RouterRunner, kept_failing
from eco_router.entrypoints.startup_checks import StartupFailure, listening_socket

log = logging.getLogger(__name__)


class _OpsServer(uvicorn.Server):
    """uvicorn without its own signal handling or exit: the worker governs its shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn exits the process when it cannot listen; the worker must close its
        # connections and say so first (`started` stays False).
        try:
            await super().startup(sockets)
        except SystemExit:
            self.should_exit = True

    @property
    def bound_port(self) -> int | None:
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return None


async def serve(container: Container, stop: asyncio.Event) -> None:
    """Run until `stop` is set, then drain and close; tests drive this directly."""
    settings = container.settings()
    app = create_ops_app(container)
    config = uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = _OpsServer(config)
    # The worker serves no viewers: no Pub/Sub reader, and no `feed` check in its readiness.
    container.event_feed.override(providers.Object(None))
    # Bound before the router starts: a taken port is one line with its reason, nothing else.
    sock = listening_socket(
        settings.http_host,
        settings.http_port,
        elsewhere="set EVENT_ROUTER_HTTP_PORT to a free one, e.g. {port}",
    )
    try:
        await _serve_on(sock, server, container, stop)
    finally:
        sock.close()


async def _serve_on(
    sock: socket.socket, server: _OpsServer, container: Container, stop: asyncio.Event
) -> None:
    settings = container.settings()
    async with RouterRunner(container) as runner:
        http = asyncio.create_task(server.serve(sockets=[sock]), name="ops-http")
        # uvicorn exposes `started` as a flag only, so poll it briefly.
        while not server.started and not http.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if not server.started:
            # uvicorn has logged why.
            raise StartupFailure(
                f"cannot listen on {settings.http_host}:{settings.http_port}",
                ExitCode.UNREACHABLE,
            )
        settle_garbage_collector()
        log.info(
            "worker %s ready; health and metrics on http://%s:%s",
            settings.consumer_name,
            settings.http_host,
            server.bound_port,
        )
        stopped = asyncio.create_task(stop.wait())
        router_ended = asyncio.create_task(runner.wait())
        await asyncio.wait({stopped, router_ended}, return_when=asyncio.FIRST_COMPLETED)
        log.info("stopping: draining the in-flight batch")
        stopped.cancel()
    server.should_exit = True
    await http
    if router_ended.done() and not router_ended.cancelled() and router_ended.exception():
        if kept_failing(router_ended.exception()):
            raise SystemExit(ExitCode.TASK_KEPT_FAILING)
        raise RuntimeError("the router stopped on an error") from router_ended.exception()
    router_ended.cancel()
