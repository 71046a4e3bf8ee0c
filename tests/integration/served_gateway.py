"""The gateway served by uvicorn inside the test's event loop, on a real socket and real Redis.

Unlike an `eco-router serve` child process, a test can look inside it (the feed's queues)
while real clients talk to it over TCP.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from eco_router.entrypoints.container import Container, build_container
from eco_router.entrypoints.http.app import create_app, end_streams
from eco_router.entrypoints.http.server_config import server_config
from eco_router.entrypoints.resolve import resolve
from eco_router.entrypoints.settings import Settings, load_settings
from tests.integration.support import CHANNEL_PREFIX, FAMILIES_SPEC, eventually


@dataclass
class ServedGateway:
    base_url: str
    container: Container
    app: FastAPI

    async def feed(self) -> object:
        return await resolve(self.container.event_feed())


def gateway_settings(streams_url: str, pubsub_url: str, **overrides: object) -> Settings:
    """The documented defaults, but for the servers and what `overrides` names."""
    return load_settings(
        REDIS_STREAMS_URL=streams_url,
        REDIS_PUBSUB_URL=pubsub_url,
        streams=FAMILIES_SPEC,
        channel_prefix=CHANNEL_PREFIX,
        consumer_name="served-gateway",
        **overrides,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def served_gateway(settings: Settings) -> AsyncIterator[ServedGateway]:
    """Serve SSE (no router: tests publish on Pub/Sub themselves) until the block ends."""
    container = build_container(settings, route=False)
    app = create_app(container, route=False)
    port = _free_port()
    server = uvicorn.Server(server_config(app, settings, host="127.0.0.1", port=port))
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started or task.done(), what="server started")
        assert server.started, "the served gateway did not start"
        yield ServedGateway(f"http://127.0.0.1:{port}", container, app)
    finally:
        server.should_exit = True
        await end_streams(app)
        await asyncio.wait_for(task, timeout=15)
        container.unwire()
