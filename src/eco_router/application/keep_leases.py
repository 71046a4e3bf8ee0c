"""Use case: prove this router alive and hold its share of the shards."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from eco_router.application.errors import TransientError
from eco_router.application.held_shards import HeldShards, Phase
from eco_router.application.port_values import GroupView
from eco_router.application.ports import Clock, LeaseStore, RouterMetrics
from eco_router.application.router_health import RouterHealth
from eco_router.domain.ownership import moves_for
from eco_router.domain.streams import StreamFamily, families_by_stream, shard_of

log = logging.getLogger(__name__)

# A lapsing lease is looked at again this long after it should have expired.
EXPIRY_MARGIN_S = 0.01
# How often a shard being given up is checked for being drained (a local check).
DRAIN_CHECK_S = 0.01


class KeepLeases:
    """The heartbeat: every `renew_s`, one call marks this router alive and renews its leases.

    - A held shard whose lease shows another token now was taken by another router (this
      one was paused or cut off past its TTL): it is dropped at once; the fencing token keeps
      this router from routing it meanwhile.
    - Then every router moves towards the same balanced assignment (`moves_for`): it takes
      the free shards assigned to it (the consumer first routes what the previous holder left)
      and stops reading the shards assigned elsewhere, giving each up once nothing of it is in
      hand.
    - A lease about to lapse (its holder died) is looked at again right after it expires, so
      a standby takes it over without waiting for the next round.
    - Stop: nothing new is taken; leases are still renewed while the consumer drains, then
      all are released and the router leaves the live set, so others take over at once.
    - A failing heartbeat is logged once per episode; routing goes on under the fencing tokens.
    """

    def __init__(
        self,
        *,
        leases: LeaseStore,
        held: HeldShards,
        router: str,
        families: Sequence[StreamFamily],
        metrics: RouterMetrics,
        clock: Clock,
        renew_s: float,
        health: RouterHealth | None = None,
    ) -> None:
        self._leases = leases
        self._held = held
        self._router = router
        self._family_of = families_by_stream(families)
        self._shards = list(self._family_of)
        self._metrics = metrics
        self._clock = clock
        self._renew_s = renew_s
        self._failing = False
        self._health = health
        self.view: GroupView | None = None

    async def run(self, stop: asyncio.Event, drained: asyncio.Event) -> None:
        """Until `drained` (the consumer has finished after `stop`); then hand everything back."""
        try:
            while not drained.is_set():
                delay = self._renew_s
                try:
                    delay = await self._round(taking=not stop.is_set())
                    self._recovered()
                except TransientError as error:
                    self._failed(error)
                await self._sleep(delay, drained)
        finally:
            await self._leave()

    async def _round(self, *, taking: bool) -> float:
        view = await self._leases.heartbeat(self._router, self._held.tokens())
        self.view = view
        self._metrics.routers_alive(len(view.routers))
        for stream in self._held.streams():
            held = self._held.get(stream)
            lease = view.leases.get(stream)
            if held is not None and (lease is None or lease.token != held.token):
                log.warning(
                    "lost %s to %s (this router was paused or cut off past its lease)",
                    stream,
                    lease.owner if lease else "nobody",
                )
                self._drop(stream)
                self._metrics.lease_lost(self._family_of[stream].domain, shard_of(stream))
        if not taking:
            return self._renew_s
        moves = moves_for(self._router, self._shards, view.routers, view.owners())
        for stream in moves.release:
            held = self._held.get(stream)
            if held is not None and held.phase is not Phase.RELEASING:
                log.info("handing %s over (rebalancing)", stream)
                self._held.start_release(stream)
        for stream in moves.acquire:
            lease = await self._leases.acquire(stream, self._router)
            if lease is not None:
                log.info("took %s (fencing token %d)", stream, lease.token)
                self._held.gain(
                    stream, lease.token, since_ms=lease.since_ms, now_s=self._clock.monotonic()
                )
                self._report_held(stream, lease.since_ms)
        return self._next_delay(view)

    def _next_delay(self, view: GroupView) -> float:
        delay = self._renew_s
        for stream, lease in view.leases.items():
            if stream not in self._held:
                left_s = (lease.expires_ms - view.now_ms) / 1000 + EXPIRY_MARGIN_S
                delay = min(delay, max(left_s, EXPIRY_MARGIN_S))
        return delay

    async def _sleep(self, delay_s: float, drained: asyncio.Event) -> None:
        deadline = self._clock.monotonic() + delay_s
        while not drained.is_set():
            await self._release_drained()
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return
            step = min(left, DRAIN_CHECK_S) if self._releasing() else left
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(step):
                    await drained.wait()

    def _releasing(self) -> bool:
        return bool(self._held.tokens([Phase.RELEASING]))

    async def _release_drained(self) -> None:
        for stream in self._held.drained():
            held = self._held.get(stream)
            if held is None:
                continue
            try:
                await self._leases.release(stream, self._router, held.token)
            except TransientError as error:
                self._failed(error)
                return
            log.info("handed %s over", stream)
            self._drop(stream)

    async def _leave(self) -> None:
        try:
            for stream, token in self._held.tokens().items():
                await self._leases.release(stream, self._router, token)
                self._drop(stream)
            await self._leases.leave(self._router)
        except TransientError as error:
            log.warning("could not hand the shards over (they lapse by themselves): %s", error)

    def _drop(self, stream: str) -> None:
        self._held.lose(stream)
        self._report_held(stream, None)

    def _report_held(self, stream: str, since_ms: int | None) -> None:
        self._metrics.shard_held(self._family_of[stream].domain, shard_of(stream), since_ms)

    def _failed(self, error: TransientError) -> None:
        if self._health is not None:
            self._health.troubled("leases", error)
        elif not self._failing:
            log.warning("heartbeat failing, leases may lapse: %s", error)
        self._failing = True

    def _recovered(self) -> None:
        if self._health is not None:
            self._health.untroubled("leases")
        elif self._failing:
            log.info("heartbeat back")
        self._failing = False
