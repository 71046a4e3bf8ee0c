"""The router as one unit: lease keeper, consumer, reclaimer and shard observer side by side,
each supervised."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from eco_router.application.backoff import Backoff
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.keep_leases import KeepLeases
from eco_router.application.observe_shards import ObserveShards
from eco_router.application.periodic import run_every
from eco_router.application.reclaim_pending import ReclaimPending
from eco_router.application.router_health import RouterHealth
from eco_router.application.supervision import supervise

log = logging.getLogger(__name__)

TASKS = ("leases", "consumer", "reclaimer", "observer")


class RouterService:
    """Runs the router's loops until `stop` is set, each under a supervisor.

    - The lease keeper outlives the consumer: it renews the leases while the consumer drains
      after `stop`, then hands every shard back.
    - A loop that dies with an unexpected error is logged at error with its traceback, fails
      readiness, counts in `event_router_task_restarts_total` and is started again after a
      back-off. One that dies more than `max_restarts` times within `restart_window_s` ends
      `run` with `TaskKeptFailing`: the process exits for its orchestrator to restart it.
    """

    def __init__(
        self,
        *,
        leases: KeepLeases,
        consume: ConsumeLoop,
        reclaim: ReclaimPending,
        observe: ObserveShards,
        reclaim_interval_s: float,
        observe_interval_s: float,
        health: RouterHealth | None = None,
        max_restarts: int = 5,
        restart_window_s: float = 60.0,
        restart_backoff: Callable[[], Backoff] = lambda: Backoff(initial_s=0.5, max_s=10.0),
    ) -> None:
        self._leases = leases
        self._consume = consume
        self._reclaim = reclaim
        self._observe = observe
        self._reclaim_interval_s = reclaim_interval_s
        self._observe_interval_s = observe_interval_s
        self.health = health or consume.health
        self._max_restarts = max_restarts
        self._restart_window_s = restart_window_s
        self._restart_backoff = restart_backoff

    @property
    def alive(self) -> bool:
        """True while every supervised loop runs."""
        checks = self.health.checks()
        return all(checks.get(task) == "ok" for task in TASKS)

    async def run(self, stop: asyncio.Event) -> None:
        """Run every loop; returns once all have drained after `stop`."""
        drained = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._consume_then(drained, stop), name="consumer")
            group.create_task(self._keep_leases(stop, drained), name="leases")
            group.create_task(
                self._supervised(
                    "reclaimer",
                    lambda: run_every(
                        self._reclaim_interval_s,
                        stop,
                        self._reclaim,
                        name="reclaimer",
                        health=self.health,
                        run_first=False,
                    ),
                    stop,
                ),
                name="reclaimer",
            )
            group.create_task(
                self._supervised(
                    "observer",
                    lambda: run_every(
                        self._observe_interval_s,
                        stop,
                        self._observe,
                        name="observer",
                        health=self.health,
                    ),
                    stop,
                ),
                name="observer",
            )
        log.info("router stopped")

    async def _consume_then(self, drained: asyncio.Event, stop: asyncio.Event) -> None:
        try:
            await self._supervised("consumer", lambda: self._consume.run(stop), stop)
        finally:
            drained.set()

    async def _keep_leases(self, stop: asyncio.Event, drained: asyncio.Event) -> None:
        self.health.task_running("leases")
        # Shards are taken only once the groups exist, so a take-over's claim finds them.
        prepared = asyncio.ensure_future(self._consume.prepared.wait())
        ended = asyncio.ensure_future(drained.wait())
        await asyncio.wait({prepared, ended}, return_when=asyncio.FIRST_COMPLETED)
        prepared.cancel()
        ended.cancel()
        # The keeper runs until the consumer has drained, restarts included.
        await self._supervised("leases", lambda: self._leases.run(stop, drained), drained)

    async def _supervised(
        self, name: str, run: Callable[[], Awaitable[None]], until: asyncio.Event
    ) -> None:
        """Run `run()` under supervision until `until` is set; `TaskKeptFailing` when it dies
        too often."""
        await supervise(
            name,
            run,
            until,
            health=self.health,
            backoff=self._restart_backoff(),
            max_restarts=self._max_restarts,
            restart_window_s=self._restart_window_s,
        )
