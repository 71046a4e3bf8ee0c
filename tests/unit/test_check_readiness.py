"""CheckReadiness: what `/ready` reports, with and without a router in the process."""

from __future__ import annotations

import asyncio

from eco_router.adapters.memory.readiness_metrics import InMemoryReadinessMetrics
from eco_router.application.check_readiness import CheckReadiness
from eco_router.application.router_service import RouterService
from tests.unit.factories import Harness


def router_service(h: Harness) -> RouterService:
    return h.router_service()


def readiness(h: Harness, router: RouterService | None) -> CheckReadiness:
    return CheckReadiness(source=h.source, broadcaster=h.broadcaster, router=router)


class TestWithARouter:
    async def test_a_router_that_runs_with_both_servers_answering_is_ready(self) -> None:
        h = Harness()
        await h.source.prepare()
        router, stop = router_service(h), asyncio.Event()
        running = asyncio.create_task(router.run(stop))
        try:
            while not router.alive:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            checks = await readiness(h, router)()
        finally:
            stop.set()
            await running

        assert checks == {
            "streams": "ok",
            "pubsub": "ok",
            "leases": "ok",
            "consumer": "ok",
            "reclaimer": "ok",
            "observer": "ok",
        }

    async def test_a_router_that_is_not_running_is_reported(self) -> None:
        h = Harness()

        checks = await readiness(h, router_service(h))()

        assert checks["router"] == "not running"


class TestWithoutARouter:
    async def test_a_gateway_that_does_not_route_is_asked_only_about_its_servers(self) -> None:
        h = Harness()

        assert await readiness(h, None)() == {"streams": "ok", "pubsub": "ok"}

    async def test_an_unreachable_server_is_named_with_its_error(self) -> None:
        h = Harness()
        h.broadcaster.available = False

        checks = await readiness(h, None)()

        assert checks["streams"] == "ok"
        assert checks["pubsub"].startswith("unreachable: ")


class TestReportedOutcome:
    async def test_every_check_goes_to_the_readiness_metrics_failing_ones_included(
        self,
    ) -> None:
        h = Harness()
        h.broadcaster.available = False
        metrics = InMemoryReadinessMetrics()
        check = CheckReadiness(
            source=h.source, broadcaster=h.broadcaster, router=None, metrics=metrics
        )

        checks = await check()

        assert metrics.reports == [checks]
        assert checks["pubsub"].startswith("unreachable")
