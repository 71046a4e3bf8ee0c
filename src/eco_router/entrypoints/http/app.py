"""The HTTP application factory and its lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from eco_router import __version__
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.http import ops_routes
from eco_router.entrypoints.runner import RouterRunner

log = logging.getLogger(__name__)


def create_app(container: Container, *, run_router: bool = True) -> FastAPI:
    """The app; with `run_router` its lifespan opens the connections and runs the router."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not run_router:
            yield
            return
        async with RouterRunner(container) as runner:
            app.state.runner = runner
            yield

    app = FastAPI(title="eco-router", version=__version__, lifespan=lifespan)
    app.state.container = container
    container.wire(modules=[ops_routes])
    app.include_router(ops_routes.router)
    return app
