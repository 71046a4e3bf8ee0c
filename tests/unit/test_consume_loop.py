"""ConsumeLoop on the in-memory adapters: start-up, routing, retrying, recovering, stopping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.messages import Delivery, EncodedEvent
from eco_router.domain.verdict import Judgement, Verdict
from tests.unit.factories import Harness, eventually

STOP_WITHIN_S = 5.0


@asynccontextmanager
async def running(loop: ConsumeLoop) -> AsyncIterator[tuple[asyncio.Event, asyncio.Task[None]]]:
    """Run the loop in a task; on exit, ask it to stop and wait for it (bounded)."""
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        yield stop, task
    finally:
        stop.set()
        async with asyncio.timeout(STOP_WITHIN_S):
            await task


class CountingSource(InMemoryEventSource):
    """An in-memory source that remembers how often start-up was attempted."""

    prepare_calls = 0

    async def prepare(self) -> None:
        self.prepare_calls += 1
        await super().prepare()


class FailingOnceStore(InMemoryStateStore):
    """A state store with a bug that strikes the first batch holding `job_id`."""

    def __init__(self, job_id: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.job_id = job_id
        self.struck = False

    async def apply(self, events: Sequence[EncodedEvent]) -> list[Judgement]:
        if not self.struck and any(e.event.job_id == self.job_id for e in events):
            self.struck = True
            raise RuntimeError("bug in the store")
        return await super().apply(events)


class TestRouting:
    async def test_routes_entries_then_stops_when_asked(self) -> None:
        h = Harness()
        h.xadd("job-1", 1)
        h.xadd("job-1", 2)
        h.xadd("job-2", 1)

        async with running(h.consume_loop()) as (stop, task):
            await eventually(lambda: len(h.broadcaster.sent) == 3)
            stop.set()
            async with asyncio.timeout(STOP_WITHIN_S):
                await task

        assert h.published_seqs("job-1") == [1, 2]
        assert h.published_seqs("job-2") == [1]
        assert h.pending() == {}

    async def test_entries_written_while_it_waits_are_routed(self) -> None:
        h = Harness()

        async with running(h.consume_loop()):
            await eventually(h.groups_ready)
            for seq in (1, 2, 3):
                h.xadd("job-1", seq)
            await eventually(lambda: h.published_seqs("job-1") == [1, 2, 3])

        assert h.pending() == {}

    async def test_batches_larger_than_one_read_are_all_routed(self) -> None:
        h = Harness()
        for seq in range(1, 26):
            h.xadd("job-1", seq)

        async with running(h.consume_loop(read_count=4)):
            await eventually(lambda: len(h.published_seqs("job-1")) == 25)

        assert h.published_seqs("job-1") == list(range(1, 26))
        assert len(h.metrics.batches) >= 7
        assert max(h.metrics.batches) <= 4


class TestTransientFailures:
    async def test_a_publish_outage_ends_with_every_event_published_once(self) -> None:
        h = Harness()
        h.broadcaster.available = False
        for seq in (1, 2, 3):
            h.xadd("job-1", seq)

        async with running(h.consume_loop()):
            await eventually(lambda: h.metrics.publish_errors >= 3)
            h.xadd("job-1", 4)
            h.xadd("job-1", 5)
            retries = h.metrics.publish_errors
            await eventually(lambda: h.metrics.publish_errors >= retries + 6)
            later = h.xadd("job-1", 6)
            retries = h.metrics.publish_errors
            await eventually(lambda: h.metrics.publish_errors >= retries + 6)
            # While the batch is retried at most the one read already in flight takes entries.
            assert later not in h.pending()
            h.broadcaster.available = True
            await eventually(lambda: len(h.published_seqs("job-1")) == 6)

        assert h.published_seqs("job-1") == [1, 2, 3, 4, 5, 6]
        assert await h.history_seqs("job-1") == [1, 2, 3, 4, 5, 6]
        assert h.pending() == {}

    async def test_an_unavailable_source_at_startup_is_retried_until_available(self) -> None:
        h = Harness()
        source = CountingSource(h.streams, families=[h.family], group="router", consumer=h.consumer)
        source.available = False
        h.xadd("job-1", 1)

        async with running(h.consume_loop(source)):
            await eventually(lambda: source.prepare_calls >= 3)
            assert h.broadcaster.sent == []
            source.available = True
            await eventually(lambda: h.published_seqs("job-1") == [1])

        assert h.pending() == {}

    async def test_stopping_during_an_outage_leaves_the_batch_pending_for_reclaim(
        self,
    ) -> None:
        h = Harness()
        h.broadcaster.available = False
        entry_id = h.xadd("job-1", 1)

        async with running(h.consume_loop(drain_grace_s=0.05)) as (stop, task):
            await eventually(lambda: h.metrics.publish_errors >= 2)
            stop.set()
            async with asyncio.timeout(STOP_WITHIN_S):
                await task

        assert set(h.pending()) == {entry_id}
        assert h.broadcaster.sent == []

    async def test_a_bug_while_routing_leaves_the_batch_pending_and_goes_on(self) -> None:
        h = Harness()
        h.store = FailingOnceStore(
            "job-1", clock=h.clock, state_ttl_s=3600, markers_ttl_s=7200, history_size=100
        )
        broken = h.xadd("job-1", 1)

        async with running(h.consume_loop()):
            await eventually(lambda: h.store.struck)  # type: ignore[attr-defined]
            h.xadd("job-2", 1)
            await eventually(lambda: h.published_seqs("job-2") == [1])

        assert set(h.pending()) == {broken}
        assert h.published_seqs("job-1") == []


class TestRecovery:
    async def test_own_pending_entries_from_an_earlier_process_are_routed_first(self) -> None:
        h = Harness()
        earlier = h.consumer_source(h.consumer)
        await earlier.prepare()
        h.xadd("job-1", 1)
        h.xadd("job-1", 2)
        await earlier.read_new(count=10, block_ms=0)  # then the process dies
        h.xadd("job-1", 3)

        async with running(h.consume_loop(h.consumer_source(h.consumer))):
            await eventually(lambda: len(h.published_seqs("job-1")) == 3)

        # Read new first, 3 would have been applied and 1 and 2 judged stale.
        assert h.published_seqs("job-1") == [1, 2, 3]
        assert h.dead_lettered() == []
        assert h.pending() == {}

    async def test_pending_entries_of_other_consumers_are_left_to_the_reclaimer(self) -> None:
        h = Harness()
        other = h.consumer_source("router-2")
        await other.prepare()
        h.xadd("job-1", 1)
        taken = [d.entry_id for d in await other.read_new(count=10, block_ms=0)]
        h.xadd("job-2", 1)

        async with running(h.consume_loop()):
            await eventually(lambda: h.published_seqs("job-2") == [1])

        assert h.published_seqs("job-1") == []
        assert {i: p.consumer for i, p in h.pending().items()} == {taken[0]: "router-2"}

    async def test_own_pending_entries_deleted_meanwhile_are_acked_at_startup(self) -> None:
        h = Harness()
        earlier = h.consumer_source(h.consumer)
        await earlier.prepare()
        gone = h.xadd("job-1", 1)
        await earlier.read_new(count=10, block_ms=0)
        h.streams.delete_entry("scan:events:2", gone)

        async with running(h.consume_loop(h.consumer_source(h.consumer))):
            await eventually(lambda: h.pending() == {})

        assert h.metrics.trimmed[("scan", 2)] == 1

    async def test_a_deleted_stream_and_group_are_recreated(self) -> None:
        h = Harness()

        async with running(h.consume_loop()):
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])
            h.streams.delete_stream("scan:events:2")
            h.xadd("job-1", 2)
            await eventually(lambda: h.published_seqs("job-1") == [1, 2])
            await eventually(lambda: h.pending() == {})


class TestOrderAcrossConsumers:
    """Router `a` (the harness's consumer) holds job-1's seq 1; router `b` runs the loop."""

    @staticmethod
    async def a_holds_seq_1_and_b_can_read_seq_2(h: Harness) -> list[Delivery]:
        await h.source.prepare()
        h.xadd("job-1", 1)
        held = await h.read()
        h.xadd("job-1", 2)
        h.xadd("job-2", 1)
        return held

    async def test_a_newer_entry_waits_for_the_older_one_then_follows_it(self) -> None:
        h = Harness()
        held = await self.a_holds_seq_1_and_b_can_read_seq_2(h)

        async with running(h.consume_loop(h.consumer_source("b"), order_wait_ms=5_000)):
            await eventually(lambda: h.published_seqs("job-2") == [1])
            waited = h.published_seqs("job-1")
            await h.route(held)
            await eventually(lambda: h.published_seqs("job-1") == [1, 2])

        assert waited == []
        assert h.metrics.verdicts[("scan", Verdict.STALE)] == 0
        assert h.pending() == {}

    async def test_without_waiting_the_newer_entry_overtakes_and_the_older_is_stale(
        self,
    ) -> None:
        h = Harness()
        held = await self.a_holds_seq_1_and_b_can_read_seq_2(h)

        async with running(h.consume_loop(h.consumer_source("b"), order_wait_ms=0)):
            await eventually(lambda: h.published_seqs("job-1") == [2])
            await h.route(held)

        assert h.published_seqs("job-1") == [2]
        assert h.metrics.verdicts[("scan", Verdict.STALE)] == 1

    async def test_the_wait_ends_after_order_wait_ms_when_the_older_entry_stays_held(
        self,
    ) -> None:
        h = Harness()
        await self.a_holds_seq_1_and_b_can_read_seq_2(h)

        async with running(h.consume_loop(h.consumer_source("b"), order_wait_ms=50)):
            await eventually(lambda: h.published_seqs("job-1") == [2])

        assert [p.consumer for p in h.pending().values()] == ["router-1"]

    async def test_nothing_new_is_read_while_entries_wait(self) -> None:
        h = Harness()
        held = await self.a_holds_seq_1_and_b_can_read_seq_2(h)

        async with running(h.consume_loop(h.consumer_source("b"), order_wait_ms=5_000)):
            await eventually(lambda: h.published_seqs("job-2") == [1])
            h.xadd("job-3", 1)
            await asyncio.sleep(0.05)
            while_waiting = h.published_seqs("job-3")
            await h.route(held)
            await eventually(lambda: h.published_seqs("job-3") == [1])

        assert while_waiting == []
        assert h.published_seqs("job-1") == [1, 2]

    async def test_a_stop_routes_the_waiting_entries_instead_of_stranding_them(self) -> None:
        h = Harness()
        await self.a_holds_seq_1_and_b_can_read_seq_2(h)

        async with running(h.consume_loop(h.consumer_source("b"), order_wait_ms=60_000)) as (
            stop,
            task,
        ):
            await eventually(lambda: h.published_seqs("job-2") == [1])
            stop.set()
            async with asyncio.timeout(STOP_WITHIN_S):
                await task

        assert h.published_seqs("job-1") == [2]
        assert [p.consumer for p in h.pending().values()] == ["router-1"]
