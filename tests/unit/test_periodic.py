"""run_every: a periodic job that fails transiently is retried with back-off, not at its next
interval, so readiness turns ready again as soon as the server answers."""

from __future__ import annotations

import asyncio

import pytest

from eco_router.adapters.memory.metrics import InMemoryRouterMetrics
from eco_router.application.backoff import Backoff
from eco_router.application.errors import TransientError
from eco_router.application.periodic import run_every
from eco_router.application.router_health import RouterHealth
from tests.unit.factories import Harness, eventually

# Far longer than any test waits: a retry that waited for it would fail the test.
INTERVAL_S = 3600.0


class FlakyJob:
    """Fails with a TransientError while `down`, counting its calls."""

    def __init__(self) -> None:
        self.down = False
        self.calls = 0
        self.failures = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.down:
            self.failures += 1
            raise TransientError("connection refused")


def health() -> RouterHealth:
    return RouterHealth(clock=Harness().clock, metrics=InMemoryRouterMetrics())


class TestAPeriodicJobThatFailsTransiently:
    async def test_it_is_retried_with_the_default_back_off_and_ready_again_once_it_succeeds(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        job, router_health, stop = FlakyJob(), health(), asyncio.Event()
        job.down = True
        loop = asyncio.create_task(
            run_every(
                INTERVAL_S,
                stop,
                job,
                name="reclaimer",
                health=router_health,
            )
        )
        try:
            await eventually(lambda: job.failures >= 3)
            assert router_health.troubled_now("reclaimer")
            job.down = False
            await eventually(lambda: not router_health.troubled_now("reclaimer"))
            calls = job.calls
            await asyncio.sleep(0.05)
        finally:
            stop.set()
            await loop

        # Once it works, the job waits for its interval again.
        assert job.calls == calls
        warnings = [r for r in caplog.records if "transient failure" in r.message]
        assert len(warnings) == 1

    async def test_no_retry_waits_longer_than_the_interval(self) -> None:
        job, stop = FlakyJob(), asyncio.Event()
        job.down = True
        loop = asyncio.create_task(
            run_every(
                0.01,
                stop,
                job,
                name="observer",
                health=health(),
                backoff=Backoff(initial_s=INTERVAL_S, max_s=INTERVAL_S),
            )
        )
        try:
            await eventually(lambda: job.failures >= 3)
        finally:
            stop.set()
            await loop
