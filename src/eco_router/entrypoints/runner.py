"""Running the router inside a process: connections up, loops started, ordered shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from eco_router.adapters.redis.connections.slots import nodes_of
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.application.router_service import RouterService
from eco_router.application.supervision import TaskKeptFailing
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.resolve import resolve

log = logging.getLogger(__name__)


def kept_failing(error: BaseException | None) -> bool:
    """Whether the router ended because a supervised task kept dying."""
    if isinstance(error, TaskKeptFailing):
        return True
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(TaskKeptFailing) is not None
    return False


class RouterRunner:
    """Async context: opens the container's resources and runs the router until exit.

    Exit order: stop reading, let the in-flight batch finish (publish and ack) within
    `drain_timeout_s`, cancel and await what is left, then close the connections. With
    `route=False` it only opens and closes the resources (a gateway that does not route).
    """

    def __init__(
        self, container: Container, *, drain_timeout_s: float = 8.0, route: bool = True
    ) -> None:
        self._container = container
        self._drain_timeout_s = drain_timeout_s
        self._route = route
        self.stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.router: RouterService | None = None

    async def __aenter__(self) -> RouterRunner:
        await resolve(self._container.init_resources())
        if not self._route:
            return self
        try:
            self.router = await resolve(self._container.router())
            await _report_held_jobs(self._container)
            _log_placement(await resolve(self._container.streams_redis()), self._container)
            self._task = asyncio.create_task(self.router.run(self.stop), name="router")
        except BaseException:
            await resolve(self._container.shutdown_resources())
            raise
        return self

    async def wait(self) -> None:
        """Until the router ends by itself (it only does after `stop`, or on a crash)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop.set()
        try:
            if self._task is not None:
                await self._drain(self._task)
        finally:
            await resolve(self._container.shutdown_resources())

    async def _drain(self, task: asyncio.Task[None]) -> None:
        done, _ = await asyncio.wait({task}, timeout=self._drain_timeout_s)
        if not done:
            log.warning("router did not drain in %.1f s, cancelling", self._drain_timeout_s)
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await task
            except Exception:
                log.exception("router ended with an error")


def _log_placement(client: object, container: Container) -> None:
    """On a Redis Cluster, which master holds each shard (they should spread evenly)."""
    streams = [s for f in container.settings().streams for s in f.streams]
    placed = nodes_of(client, streams)
    if placed:
        log.info("shards on the cluster: %s", ", ".join(f"{s} on {n}" for s, n in placed.items()))


async def _report_held_jobs(container: Container) -> None:
    store = await resolve(container.state_store())
    if isinstance(store, RedisLuaStateStore):
        metrics = await resolve(container.metrics())
        metrics.count_held_jobs(lambda: store.held_jobs)
