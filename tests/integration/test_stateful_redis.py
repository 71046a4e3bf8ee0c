"""The stateful fault test (tests/faults/test_stateful.py) with the job state in the Redis store
on a real Redis: the same random interleavings of routers joining, stopping, dying, pausing
and cut off, producers and outages, checked the same way.

The routers run on the virtual-time loop, which never waits for real I/O, so the store runs on
a real event loop of its own thread and each call blocks the virtual loop until its reply: a
call takes no virtual time, as the in-memory store's does (the gate still adds the wire's).
Before each apply, the lease table's fencing epochs are written to the shards' epoch keys,
as the lease store writes them on each take-over: the store's fence sees what a real one
would. The streams stay in memory, so the store finds none in Redis: its read-order check
sees no gap (the in-memory store's checks the pending entries) and no entry gone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from redis.asyncio import Redis

from eco_router.adapters.memory.leases import LeaseTable
from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.application.port_values import Applied, EncodedEvent, JobView, ReadStart
from eco_router.application.ports import StateStore
from eco_router.domain.text import JobText
from eco_router.testing import RedisServer
from tests.faults.test_stateful import JOBS, STEPS, TTL_S, LeasedRoutersMachine, Totals
from tests.unit.factories import FAMILY, GROUP

T = TypeVar("T")

# Each call is a round trip to a real server: far fewer than the in-memory run's.
MAX_EXAMPLES = 30
# A reply this late means the server is gone: fail, rather than hang the loop.
CALL_TIMEOUT_S = 30


class RedisStoreOnItsOwnLoop(StateStore):
    """`RedisLuaStateStore` on a real event loop in a thread of its own, called from the
    virtual-time loop: each call returns only with its reply."""

    def __init__(self, url: str, table: LeaseTable) -> None:
        self._table = table
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._redis, self._store = self._call(self._open(url))

    async def _open(self, url: str) -> tuple[Redis, RedisLuaStateStore]:
        redis = Redis.from_url(url)
        assert await redis.dbsize() == 0, "an earlier example left keys behind"
        store = RedisLuaStateStore(
            redis,
            families=[FAMILY],
            group=GROUP,
            state_ttl_s=TTL_S,
            markers_ttl_s=TTL_S,
            history_size=1_000,
        )
        return redis, store

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CALL_TIMEOUT_S)

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        return self._call(self._fenced_apply(events, fence, in_order))

    async def _fenced_apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None,
    ) -> Applied:
        epochs = {GroupKeys(GROUP).epoch(s): token for s, token in self._table.epochs.items()}
        if epochs:
            await self._redis.mset(epochs)
        return await self._store.apply(events, fence, in_order)

    async def view(self, domain: str, job_id: str) -> JobView:
        return self._call(self._store.view(domain, job_id))

    async def text(self, domain: str, job_id: str) -> JobText | None:
        return self._call(self._store.text(domain, job_id))

    def close(self) -> None:
        """Delete every key the example wrote, and end the thread."""
        try:
            self._call(self._cleared())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    async def _cleared(self) -> None:
        keys = [GroupKeys(GROUP).epoch(stream) for stream in FAMILY.streams]
        for job_id in JOBS:
            job = JobKeys.in_family(FAMILY, job_id)
            keys += [job.state, job.history, job.markers, job.text_state, job.text]
        await self._redis.delete(*keys)
        left = await self._redis.dbsize()
        await self._redis.aclose()
        assert left == 0, f"{left} keys the example wrote were not deleted"


class LeasedRoutersOnRedis(LeasedRoutersMachine):
    """The machine with its state store on Redis."""

    url = ""

    def __init__(self, totals: Totals) -> None:
        super().__init__(totals)
        self.redis_store = RedisStoreOnItsOwnLoop(self.url, self.table)
        self.store = self.redis_store  # type: ignore[assignment]

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self.redis_store.close()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


def test_every_owed_event_reaches_clients_in_order_with_the_state_on_redis(
    server: RedisServer,
) -> None:
    totals = Totals()
    LeasedRoutersOnRedis.url = server.url
    run_state_machine_as_test(
        lambda: LeasedRoutersOnRedis(totals),  # type: ignore[arg-type]
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    assert totals.examples > 1
