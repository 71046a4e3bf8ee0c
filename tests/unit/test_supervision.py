"""RouterService supervises its loops: a loop that dies is logged, reported and restarted;
one that keeps dying ends the router."""

from __future__ import annotations

import asyncio

import pytest

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.backoff import Backoff
from eco_router.application.check_readiness import CheckReadiness
from eco_router.application.observe_shards import ObserveShards
from eco_router.application.port_values import ShardStats
from eco_router.application.router_health import RouterHealth
from eco_router.application.router_service import RouterService
from eco_router.application.supervision import TaskKeptFailing
from eco_router.entrypoints.runner import kept_failing
from tests.unit.factories import Harness, eventually


class BrokenStats(InMemoryEventSource):
    """A source whose shard statistics fail with a bug `failures` times, then work."""

    failures = 0

    async def shard_stats(self) -> list[ShardStats]:
        if self.failures:
            self.failures -= 1
            raise KeyError("a bug in the observer")
        return await super().shard_stats()


def service(h: Harness, source: BrokenStats, *, max_restarts: int) -> RouterService:
    router = h.router_service()
    health = router.health
    return RouterService(
        leases=router._leases,
        consume=router._consume,
        reclaim=router._reclaim,
        observe=ObserveShards(source=source, metrics=h.metrics),
        reclaim_interval_s=0.01,
        observe_interval_s=0.01,
        health=health,
        max_restarts=max_restarts,
        restart_window_s=60,
        restart_backoff=lambda: Backoff(initial_s=0.001, max_s=0.002),
    )


def broken_source(h: Harness, failures: int) -> BrokenStats:
    source = BrokenStats(h.streams, families=[h.family], group="eventrouter", consumer="obs")
    source.failures = failures
    return source


class TestATaskThatDies:
    async def test_it_is_restarted_counted_and_ready_again(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        h = Harness()
        source = broken_source(h, failures=2)
        router, stop = service(h, source, max_restarts=5), asyncio.Event()
        running = asyncio.create_task(router.run(stop))
        try:
            await eventually(lambda: h.metrics.restarts["observer"] == 2)
            await eventually(lambda: router.alive)
            checks = await CheckReadiness(
                source=h.source, broadcaster=h.broadcaster, router=router
            )()
        finally:
            stop.set()
            await running

        assert checks["observer"] == "ok"
        died = [r for r in caplog.records if r.levelname == "ERROR" and "observer" in r.message]
        assert len(died) == 2

    async def test_readiness_names_it_while_it_is_down(self) -> None:
        h = Harness()
        health = RouterHealth(clock=h.clock, metrics=h.metrics)
        health.task_running("observer")
        health.task_failed("observer", "restarting after KeyError: 'x'")

        assert health.checks() == {"observer": "restarting after KeyError: 'x'"}

    async def test_one_that_keeps_dying_ends_the_router_with_task_kept_failing(self) -> None:
        h = Harness()
        source = broken_source(h, failures=1000)
        router = service(h, source, max_restarts=3)

        with pytest.raises(BaseExceptionGroup) as raised:
            async with asyncio.timeout(10):
                await router.run(asyncio.Event())

        assert raised.group_contains(TaskKeptFailing)
        assert kept_failing(raised.value)
        assert h.metrics.restarts["observer"] == 3
        assert router.health.checks()["observer"].startswith("kept failing: KeyError")
