"""CheckReadiness: what `/ready` reports, with and without a router in the process."""

from __future__ import annotations

import asyncio
import logging

import pytest

from eco_router.adapters.memory.readiness_metrics import InMemoryReadinessMetrics
from eco_router.application.check_readiness import CheckReadiness, public_checks
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


class TestPublicChecks:
    def test_failing_checks_name_their_component_and_no_cause(self) -> None:
        checks = {
            "streams": "unreachable: PING: ConnectionError: Error 111 connecting to 10.0.0.7:6379.",
            "pubsub": "ok",
            "feed": "retrying: Pub/Sub connection to 10.0.0.8:6379 lost: timeout",
            "consumer": "retrying: claim on scan:events:1: ConnectionError: Error 111",
            "router": "not running",
            "shard scan:events:2": "quarantined: WRONGTYPE Operation against a key",
        }

        assert public_checks(checks) == {
            "streams": "streams redis unreachable",
            "pubsub": "ok",
            "feed": "live feed interrupted",
            "consumer": "consumer failing",
            "router": "router not running",
            "shard scan:events:2": "quarantined",
        }

    def test_passing_checks_are_unchanged(self) -> None:
        checks = {"streams": "ok", "pubsub": "ok", "feed": "ok"}

        assert public_checks(checks) == checks


class TestLoggedCauses:
    async def test_a_failing_check_is_logged_with_its_cause_once_and_its_recovery_once(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        h = Harness()
        check = readiness(h, None)
        caplog.set_level(logging.INFO, logger="eco_router.application.check_readiness")

        h.broadcaster.available = False
        await check()
        await check()
        h.broadcaster.available = True
        await check()
        await check()

        assert [(r.levelname, r.getMessage().split(":")[0:2]) for r in caplog.records] == [
            # The failing component warns once itself; this records the transition.
            ("INFO", ["not ready", " pubsub"]),
            ("INFO", ["ready again", " pubsub"]),
        ]
        assert "unreachable" in caplog.records[0].getMessage()
