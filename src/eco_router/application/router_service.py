"""The router as one unit: lease keeper, consumer, reclaimer and shard observer side by side."""

from __future__ import annotations

import asyncio
import logging

from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.keep_leases import KeepLeases
from eco_router.application.observe_shards import ObserveShards
from eco_router.application.periodic import run_every
from eco_router.application.reclaim_pending import ReclaimPending

log = logging.getLogger(__name__)


class RouterService:
    """Runs the router's loops until `stop` is set and tells whether they are alive.

    The lease keeper outlives the consumer: it renews the leases while the consumer drains
    after `stop`, then hands every shard back.
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
    ) -> None:
        self._leases = leases
        self._consume = consume
        self._reclaim = reclaim
        self._observe = observe
        self._reclaim_interval_s = reclaim_interval_s
        self._observe_interval_s = observe_interval_s
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def alive(self) -> bool:
        """True while the lease keeper, the consumer and the reclaimer all run."""
        return all(
            name in self._tasks and not self._tasks[name].done()
            for name in ("leases", "consumer", "reclaimer")
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Run every loop; returns once all have drained after `stop`."""
        drained = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            self._tasks = {
                "consumer": group.create_task(self._consume_then(drained, stop), name="consumer"),
                "leases": group.create_task(self._keep_leases(stop, drained), name="leases"),
                "reclaimer": group.create_task(
                    run_every(
                        self._reclaim_interval_s,
                        stop,
                        self._reclaim,
                        name="reclaimer",
                        run_first=False,
                    ),
                    name="reclaimer",
                ),
                "observer": group.create_task(
                    run_every(self._observe_interval_s, stop, self._observe, name="observer"),
                    name="observer",
                ),
            }
        log.info("router stopped")

    async def _consume_then(self, drained: asyncio.Event, stop: asyncio.Event) -> None:
        try:
            await self._consume.run(stop)
        finally:
            drained.set()

    async def _keep_leases(self, stop: asyncio.Event, drained: asyncio.Event) -> None:
        # Shards are taken only once the groups exist, so a take-over's claim finds them.
        prepared = asyncio.ensure_future(self._consume.prepared.wait())
        ended = asyncio.ensure_future(drained.wait())
        await asyncio.wait({prepared, ended}, return_when=asyncio.FIRST_COMPLETED)
        prepared.cancel()
        ended.cancel()
        await self._leases.run(stop, drained)
