"""ConsumeLoop on the in-memory adapters: start-up, take-over, held shards, retrying, stopping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.errors import PermanentError
from eco_router.application.held_shards import HeldShards
from eco_router.application.messages import Applied, EncodedEvent, ReadStart
from eco_router.domain.verdict import Verdict
from tests.unit.factories import GROUP, Harness, eventually

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

    async def prepare(self, streams: Collection[str] | None = None) -> dict[str, PermanentError]:
        self.prepare_calls += 1
        return await super().prepare(streams)


class FailingOnceStore(InMemoryStateStore):
    """A state store with a bug that strikes the first batch holding `job_id`."""

    def __init__(self, job_id: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.job_id = job_id
        self.struck = False

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        if not self.struck and any(e.event.job_id == self.job_id for e in events):
            self.struck = True
            raise RuntimeError("bug in the store")
        return await super().apply(events, fence, in_order)


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
            "job-1",
            clock=h.clock,
            streams=h.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=100,
        )
        broken = h.xadd("job-1", 1)

        async with running(h.consume_loop()):
            await eventually(lambda: h.store.struck)  # type: ignore[attr-defined]
            h.xadd("job-2", 1)
            await eventually(lambda: h.published_seqs("job-2") == [1])

        assert set(h.pending()) == {broken}
        assert h.published_seqs("job-1") == []


def another_router_takes(h: Harness, stream: str) -> None:
    """Another router acquires `stream`: its fencing epoch moves past the harness's token."""
    h.leases.epochs[stream] = h.fence[stream] + 1


class TestTakeOver:
    """The loop has just taken every shard: it routes what earlier holders left first."""

    async def test_what_a_dead_holder_left_is_routed_before_newer_entries(self) -> None:
        h = Harness()
        dead = h.consumer_source("router-0")
        await dead.prepare()
        h.xadd("job-1", 1)
        h.xadd("job-1", 2)
        await h.read(source=dead)  # then router-0 dies holding seq 1 and 2
        h.xadd("job-1", 3)

        async with running(h.consume_loop()):
            await eventually(lambda: len(h.published_seqs("job-1")) == 3)

        # Read new first, 3 would have been applied and 1 and 2 judged stale.
        assert h.published_seqs("job-1") == [1, 2, 3]
        assert h.metrics.verdicts[("scan", Verdict.STALE)] == 0
        assert h.pending() == {}
        [(domain, shard, claimed)] = [t for t in h.metrics.takeovers if t[2]]
        assert (domain, shard, claimed) == ("scan", 2, 2)

    async def test_own_pending_entries_from_an_earlier_process_are_routed_first(self) -> None:
        h = Harness()
        earlier = h.consumer_source(h.consumer)
        await earlier.prepare()
        h.xadd("job-1", 1)
        h.xadd("job-1", 2)
        await h.read(source=earlier)  # then the process dies
        h.xadd("job-1", 3)

        async with running(h.consume_loop(h.consumer_source(h.consumer))):
            await eventually(lambda: len(h.published_seqs("job-1")) == 3)

        assert h.published_seqs("job-1") == [1, 2, 3]
        assert h.dead_lettered() == []
        assert h.pending() == {}

    async def test_pending_entries_deleted_meanwhile_are_acked_and_counted(self) -> None:
        h = Harness()
        earlier = h.consumer_source("router-0")
        await earlier.prepare()
        gone = h.xadd("job-1", 1)
        await h.read(source=earlier)
        h.streams.delete_entry("scan:events:2", gone)

        async with running(h.consume_loop()):
            await eventually(lambda: h.pending() == {})

        assert h.metrics.trimmed[("scan", 2)] == 1

    async def test_a_take_over_larger_than_a_page_keeps_stream_order(self) -> None:
        h = Harness()
        dead = h.consumer_source("router-0")
        await dead.prepare()
        for seq in range(1, 26):
            h.xadd("job-1", seq)
        await h.read(source=dead)
        h.xadd("job-1", 26)

        async with running(h.consume_loop(read_count=4)):
            await eventually(lambda: len(h.published_seqs("job-1")) == 26)

        assert h.published_seqs("job-1") == list(range(1, 27))
        assert h.metrics.verdicts[("scan", Verdict.STALE)] == 0

    async def test_a_deleted_stream_and_group_are_recreated(self) -> None:
        h = Harness()

        async with running(h.consume_loop()):
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])
            h.streams.delete_stream("scan:events:2")
            h.clock.advance(1)  # a stream appended to again gets ids of a later millisecond
            h.xadd("job-1", 2)
            await eventually(lambda: h.published_seqs("job-1") == [1, 2])
            await eventually(lambda: h.pending() == {})


class TestHeldShards:
    async def test_a_router_holding_no_shard_reads_nothing_until_it_gains_one(self) -> None:
        h = Harness()
        held = HeldShards()
        h.xadd("job-1", 1)

        async with running(h.consume_loop(held=held)):
            await eventually(h.groups_ready)
            await asyncio.sleep(0.02)
            before = list(h.broadcaster.sent)
            stream = h.family.stream_for("job-1")
            held.gain(stream, h.fence[stream], since_ms=h.clock.now_ms(), now_s=0.0)
            await eventually(lambda: h.published_seqs("job-1") == [1])

        assert before == []
        assert h.pending() == {}

    async def test_only_the_held_shards_are_read(self) -> None:
        h = Harness()
        held = h.held_shards()
        outside = h.family.stream_for("job-2")
        held.lose(outside)
        h.xadd("job-1", 1)
        h.xadd("job-2", 1)

        async with running(h.consume_loop(held=held)):
            await eventually(lambda: h.published_seqs("job-1") == [1])
            await asyncio.sleep(0.02)

        assert h.published_seqs("job-2") == []
        assert h.streams.lag(outside, "router") == 1

    async def test_a_shard_another_router_took_is_dropped_and_left_to_it(self) -> None:
        h = Harness()
        held = h.held_shards()
        stream = h.family.stream_for("job-1")

        async with running(h.consume_loop(held=held)):
            await eventually(h.groups_ready)
            another_router_takes(h, stream)
            h.xadd("job-1", 1)
            await eventually(lambda: stream not in held)
            h.xadd("job-2", 1)
            await eventually(lambda: h.published_seqs("job-2") == [1])

        assert h.published_seqs("job-1") == []
        # Read, but neither applied nor acked: the new holder takes it over.
        assert [p.consumer for p in h.pending().values()] == ["router-1"]
        assert h.metrics.leases_lost[("scan", 2)] == 1

    async def test_entries_a_router_read_after_losing_the_shard_are_routed_first(self) -> None:
        h = Harness()
        held = h.held_shards()
        stale = h.consumer_source("router-0")

        async with running(h.consume_loop(held=held)):
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])
            h.xadd("job-1", 2)
            # router-0 lost the shard while paused and, waking, reads on before it learns so.
            stolen = await h.read(source=stale)
            h.xadd("job-1", 3)
            await eventually(lambda: h.published_seqs("job-1") == [1, 2, 3])
            await eventually(lambda: h.pending() == {})

        assert [d.entry_id for d in stolen] != []
        assert h.metrics.verdicts[("scan", Verdict.STALE)] == 0

    async def test_a_shard_being_released_is_read_no_more_and_drains(self) -> None:
        h = Harness()
        held = h.held_shards()
        stream = h.family.stream_for("job-1")

        async with running(h.consume_loop(held=held)):
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])
            held.start_release(stream)
            # The read in flight (blocked for the next entry) is woken and comes back first.
            await eventually(lambda: held.drained() == [stream])
            h.xadd("job-1", 2)
            await asyncio.sleep(0.02)

        assert h.published_seqs("job-1") == [1]
        assert h.streams.lag(stream, "router") == 1
