"""The router as one unit: consumer, reclaimer and shard observer running side by side."""

from __future__ import annotations

import asyncio
import logging

from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.observe_shards import ObserveShards
from eco_router.application.periodic import run_every
from eco_router.application.reclaim_pending import ReclaimPending

log = logging.getLogger(__name__)


class RouterService:
    """Runs the router's loops until `stop` is set and tells whether they are alive."""

    def __init__(
        self,
        *,
        consume: ConsumeLoop,
        reclaim: ReclaimPending,
        observe: ObserveShards,
        reclaim_interval_s: float,
        observe_interval_s: float,
    ) -> None:
        self._consume = consume
        self._reclaim = reclaim
        self._observe = observe
        self._reclaim_interval_s = reclaim_interval_s
        self._observe_interval_s = observe_interval_s
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def alive(self) -> bool:
        """True while the consumer and the reclaimer both run."""
        return all(
            name in self._tasks and not self._tasks[name].done()
            for name in ("consumer", "reclaimer")
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Run every loop; returns once all have drained after `stop`."""
        async with asyncio.TaskGroup() as group:
            self._tasks = {
                "consumer": group.create_task(self._consume.run(stop), name="consumer"),
                "reclaimer": group.create_task(self._reclaim_loop(stop), name="reclaimer"),
                "observer": group.create_task(
                    run_every(self._observe_interval_s, stop, self._observe, name="observer"),
                    name="observer",
                ),
            }
        log.info("router stopped")

    async def _reclaim_loop(self, stop: asyncio.Event) -> None:
        # The consumer first finishes its own pending entries; reclaiming them at the same
        # time would route (and count) the same entries twice.
        recovered = asyncio.ensure_future(self._consume.recovered.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({recovered, stopped}, return_when=asyncio.FIRST_COMPLETED)
        recovered.cancel()
        stopped.cancel()
        await run_every(self._reclaim_interval_s, stop, self._reclaim, name="reclaimer")
