"""ConsumeLoop on the in-memory adapters: it carries the read plan out (`test_read_plan.py`
checks the plan itself): start-up, take-over, held shards, retrying, stopping, acks riding on
reads, wake-ups, lost read replies, look-behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.held_shards import HeldShards, Phase
from eco_router.application.port_values import (
    Applied,
    ClaimPage,
    Delivery,
    EncodedEvent,
    ReadBatch,
    ReadStart,
)
from eco_router.domain.read_plan import LOOK_BEHIND_AFTER_ENTRIES, LOOK_BEHIND_EVERY_S
from eco_router.domain.verdict import Verdict
from tests.unit.factories import GROUP, Harness, eventually

STOP_WITHIN_S = 5.0

S = TypeVar("S", bound=InMemoryEventSource)


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


def source_of(h: Harness, kind: type[S], **extra: Any) -> S:
    """A source of `kind` reading as the harness's own consumer, as `h.source` does."""
    return kind(h.streams, families=[h.family], group=GROUP, consumer=h.consumer, **extra)


@dataclass(frozen=True, slots=True)
class Read:
    """A read on its way to the server: the acks it carries, whether it looks behind;
    `send()` has the server do it and gives its reply."""

    acks: Sequence[Delivery]
    look_behind: bool
    send: Callable[[], Awaitable[ReadBatch]]


class ReadThroughSource(InMemoryEventSource):
    """The in-memory source, each read passing through `around_read`: the fakes below change
    that hook, so that `read_new`'s signature is written once and follows the port's."""

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        read_new = super().read_new

        async def send() -> ReadBatch:
            return await read_new(
                after, count=count, acks=acks, block_ms=block_ms, look_behind=look_behind
            )

        return await self.around_read(Read(acks, look_behind, send))

    async def around_read(self, read: Read) -> ReadBatch:
        """As is, the real adapter's read."""
        return await read.send()


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


class InterruptCountingSource(InMemoryEventSource):
    """An in-memory source that counts the wakes of its blocking reads."""

    interrupts = 0

    async def interrupt(self) -> None:
        self.interrupts += 1
        await super().interrupt()


class TestBlockingReads:
    """A read that waits on the server for the first entry is woken, not waited out (it
    would end by itself within its block, at most until the next look behind is due)."""

    BLOCK_MS = 600_000

    async def test_stop_wakes_a_blocked_read(self) -> None:
        h = Harness()
        source = source_of(h, InterruptCountingSource)

        async with running(h.consume_loop(source, block_ms=self.BLOCK_MS)) as (stop, task):
            await eventually(h.groups_ready)
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])
            await asyncio.sleep(0.05)  # the read after one that drained every shard blocks
            stop.set()
            async with asyncio.timeout(STOP_WITHIN_S):
                await task

        assert source.interrupts >= 1
        assert h.pending() == {}

    async def test_a_shard_gained_wakes_a_blocked_read(self) -> None:
        h = Harness()
        source = source_of(h, InterruptCountingSource)
        first, second = h.family.streams[0], h.family.streams[1]
        held = HeldShards()
        held.gain(first, h.fence[first], since_ms=0, now_s=0.0)
        held.took_over(first)
        job = next(f"job-{i}" for i in range(100) if h.family.stream_for(f"job-{i}") == second)

        async with running(h.consume_loop(source, held=held, block_ms=self.BLOCK_MS)):
            await eventually(h.groups_ready)
            await asyncio.sleep(0.05)  # blocked on the first shard alone
            h.xadd(job, 1)
            held.gain(second, h.fence[second], since_ms=0, now_s=0.0)
            await eventually(lambda: h.published_seqs(job) == [1])
            assert source.interrupts >= 1


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
        source = source_of(h, CountingSource)
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


class AckCountingSource(ReadThroughSource):
    """Counts the calls that reach the server and which of them carried acks; can lose the
    reply of the next read that brings entries, after the server has done its work."""

    lose_next_read = False
    cut_next_read = False  # the next read carrying acks fails before reaching the server
    slow_s = 0.0  # how long a call carrying acks takes before the server sees it

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[str] = []
        self.carried = 0

    async def around_read(self, read: Read) -> ReadBatch:
        self.calls.append("read_new")
        self.carried += len(read.acks)
        if read.acks:
            await asyncio.sleep(self.slow_s)
            if self.cut_next_read:
                self.cut_next_read = False
                raise TransientError("connection reset before the server saw the read")
        batch = await read.send()
        if self.lose_next_read and batch.deliveries:
            self.lose_next_read = False
            raise TransientError("connection reset after the server had read")
        return batch

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        if deliveries:
            self.calls.append("ack")
        await super().ack(deliveries)

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        self.calls.append("claim")
        return await super().claim(
            stream, token=token, cursor=cursor, min_idle_ms=min_idle_ms, count=count
        )


class ReportingHeld(HeldShards):
    """Notes every shard reported drained while entries of it were still pending."""

    def __init__(self) -> None:
        super().__init__()
        self.pending_on: Callable[[str], Mapping[str, object]] = lambda stream: {}
        self.drained_while_pending: list[str] = []

    def drained(self) -> list[str]:
        drained = super().drained()
        self.drained_while_pending += [s for s in drained if self.pending_on(s)]
        return drained


async def run_until(h: Harness, source: AckCountingSource, done: object) -> None:
    """Run the loop until `done()` holds, then stop it and wait for its end."""
    async with running(h.consume_loop(source)):
        await eventually(h.groups_ready)
        await eventually(lambda: "read_new" in source.calls)
        await done()  # type: ignore[operator]


class TestAcksRideOnTheNextRoundTrip:
    async def test_events_arriving_one_by_one_are_acked_without_a_round_trip_of_their_own(
        self,
    ) -> None:
        h = Harness()
        source = source_of(h, AckCountingSource)

        async def one_by_one() -> None:
            for seq in range(1, 6):
                h.xadd("job-1", seq)
                await eventually(lambda seq=seq: h.published_seqs("job-1")[-1:] == [seq])
            await eventually(lambda: h.pending() == {})
            calls.extend(source.calls)

        calls: list[str] = []
        await run_until(h, source, one_by_one)

        assert h.published_seqs("job-1") == [1, 2, 3, 4, 5]
        assert source.carried >= 5
        assert "ack" not in calls

    async def test_what_is_routed_last_is_acked_at_stop(self) -> None:
        h = Harness()
        source = source_of(h, AckCountingSource)
        source.slow_s = 1.0  # stop comes while the wait carrying the ack is on its way

        async with running(h.consume_loop(source)) as (stop, task):
            await eventually(h.groups_ready)
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])

            stop.set()
            async with asyncio.timeout(STOP_WITHIN_S):
                await task

        assert h.pending() == {}

    async def test_owed_acks_land_before_a_claim_so_nothing_is_published_twice(self) -> None:
        h = Harness()
        source = source_of(h, AckCountingSource)

        async def a_backlog_whose_first_read_carrying_acks_is_cut() -> None:
            # Read 10 at a time: the third read carries the first batch's acks.
            source.cut_next_read = True
            for seq in range(1, 26):
                h.xadd("job-1", seq)
            await eventually(lambda: not source.cut_next_read)
            await eventually(lambda: h.published_seqs("job-1")[-1:] == [25])
            await eventually(lambda: h.pending() == {})

        await run_until(h, source, a_backlog_whose_first_read_carrying_acks_is_cut)

        # The cut read took the shard back to a take-over: claiming the first batch before
        # its acks landed would publish it again.
        assert h.published_seqs("job-1") == list(range(1, 26))
        assert "claim" in source.calls[source.calls.index("read_new") :]

    async def test_a_read_that_lost_its_reply_had_acked_and_acking_again_is_harmless(
        self,
    ) -> None:
        h = Harness()
        source = source_of(h, AckCountingSource)

        async def routed_then_a_read_loses_its_reply() -> None:
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])
            source.lose_next_read = True
            h.xadd("job-1", 2)
            await eventually(lambda: not source.lose_next_read)
            await eventually(lambda: h.published_seqs("job-1")[-1:] == [2])
            await eventually(lambda: h.pending() == {})

        await run_until(h, source, routed_then_a_read_loses_its_reply)

        assert h.published_seqs("job-1") == [1, 2]

    async def test_a_releasing_shard_is_given_up_only_once_its_acks_landed(self) -> None:
        h = Harness()
        source = source_of(h, AckCountingSource)
        source.slow_s = 0.2
        held = ReportingHeld()
        for stream, token in h.fence.items():
            held.gain(stream, token, since_ms=0, now_s=0.0)
            held.took_over(stream)
        held.pending_on = lambda stream: h.streams.pending(stream, GROUP)

        async with running(h.consume_loop(source, held=held)):
            await eventually(h.groups_ready)
            stream = h.family.stream_for("job-1")
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])

            held.start_release(stream)

            await eventually(lambda: stream in held.drained())
            assert held.drained_while_pending == []


class GainingDuringClaim(InMemoryEventSource):
    """Claims as the server does; while the first claim's reply travels, the lease keeper
    gains `stream` (it runs beside the consumer)."""

    def __init__(self, *args: object, held: HeldShards, stream: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.held = held
        self.stream = stream
        self.gained = False

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        page = await super().claim(
            stream, token=token, cursor=cursor, min_idle_ms=min_idle_ms, count=count
        )
        if not self.gained:
            self.gained = True
            self.held.gain(self.stream, 1, since_ms=0, now_s=0.0)
            await asyncio.sleep(0)
        return page


class TestShardGainedMeanwhile:
    async def test_a_shard_gained_during_a_take_over_that_ends_fenced_is_read(self) -> None:
        h = Harness()
        lost, gained = h.family.streams[0], h.family.streams[1]
        h.leases.epochs[lost] += 1  # another router took `lost` over: its claim is fenced
        held = HeldShards()
        held.gain(lost, 1, since_ms=0, now_s=0.0)
        source = source_of(h, GainingDuringClaim, held=held, stream=gained)
        job = next(f"job-{i}" for i in range(100) if h.family.stream_for(f"job-{i}") == gained)
        h.xadd(job, 1)

        async with running(h.consume_loop(source, held=held)):
            await eventually(lambda: h.published_seqs(job) == [1], timeout_s=2.0)
        assert h.pending() == {}


JOB = "job-1"


class ReadBetweenClaimPages(ReadThroughSource):
    """Claims and reads as the server does, and counts reads; before the take-over's second
    page, the previous holder (which has not noticed it lost the shard) reads an entry that
    was just appended."""

    def __init__(self, h: Harness, previous: InMemoryEventSource) -> None:
        super().__init__(h.streams, families=[h.family], group=GROUP, consumer=h.consumer)
        self.h = h
        self.previous = previous
        self.overlapped = False
        self.reads = 0

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        if cursor != "0-0" and not self.overlapped:
            self.overlapped = True
            self.h.xadd(JOB, 6)
            await self.previous.read_new({stream: "0-0"}, count=10)
        return await super().claim(
            stream, token=token, cursor=cursor, min_idle_ms=min_idle_ms, count=count
        )

    async def around_read(self, read: Read) -> ReadBatch:
        self.reads += 1
        return await read.send()


class TestTakeOverOverlappingTheLastRead:
    async def test_the_router_waits_for_appends_once_everything_is_routed(self) -> None:
        h = Harness()
        stream = h.family.stream_for(JOB)
        previous = h.consumer_source("previous-holder")
        for seq in range(1, 6):
            h.xadd(JOB, seq)
        await previous.read_new({stream: "0-0"}, count=10)  # left pending by the holder
        source = ReadBetweenClaimPages(h, previous)
        held = h.held_shards(Phase.TAKING_OVER)

        async with running(h.consume_loop(source, read_count=2, held=held)):
            await eventually(lambda: h.published_seqs(JOB) == [1, 2, 3, 4, 5, 6])
            assert h.pending() == {}
            reads = source.reads
            await asyncio.sleep(0.2)  # nothing new: each read waits 5 ms for an append
            assert source.reads - reads < 100


class LosingOneReply(ReadThroughSource):
    """Reads as the server does (the entries become pending to this consumer), then loses
    the reply of the first read that brought entries once `lose_next` is set."""

    lose_next = False

    async def around_read(self, read: Read) -> ReadBatch:
        batch = await read.send()
        if self.lose_next and batch.deliveries:
            self.lose_next = False
            raise TransientError("connection reset after the server had read")
        return batch


async def seq_1_read_with_a_lost_reply_then_seq_2(
    h: Harness, source: LosingOneReply | RetryingAfterALostReply
) -> None:
    """Run the loop on `source`: job-1's seq 1 is read with a lost reply, then seq 2 comes."""
    async with running(h.consume_loop(source)):
        await eventually(h.groups_ready)
        source.lose_next = True
        h.xadd("job-1", 1)
        await eventually(lambda: not source.lose_next)
        h.xadd("job-1", 2)
        await eventually(lambda: len(h.published_seqs("job-1")) >= 2, timeout_s=2.0)


class TestLostReadReply:
    async def test_entries_read_with_a_lost_reply_are_routed_before_newer_ones(self) -> None:
        h = Harness()
        source = source_of(h, LosingOneReply)
        await seq_1_read_with_a_lost_reply_then_seq_2(h, source)

        assert h.published_seqs("job-1") == [1, 2]
        assert h.pending() == {}


class RetryingAfterALostReply(ReadThroughSource):
    """Like a client that retries a read whose reply was lost: the entries the first attempt
    took are pending to this consumer, and the caller gets only the second attempt's."""

    lose_next = False

    async def around_read(self, read: Read) -> ReadBatch:
        first = await read.send()
        if not (self.lose_next and first.deliveries):
            return first
        # The reply of the attempt that took entries is lost; the retry reads on.
        self.lose_next = False
        return await read.send()


class TestRetriedRead:
    async def test_what_the_lost_attempt_took_is_routed_before_what_the_retry_read(self) -> None:
        h = Harness()
        source = source_of(h, RetryingAfterALostReply)
        await seq_1_read_with_a_lost_reply_then_seq_2(h, source)

        assert h.published_seqs("job-1") == [1, 2]
        assert h.pending() == {}


class RecordingSource(ReadThroughSource):
    """Notes, for each read that brought entries, whether it looked behind and how many
    entries it brought."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.reads: list[tuple[bool, int]] = []
        self.calls: list[bool] = []  # whether each read, entries or not, looked behind

    async def around_read(self, read: Read) -> ReadBatch:
        self.calls.append(read.look_behind)
        batch = await read.send()
        if batch.deliveries:
            self.reads.append((read.look_behind, len(batch.deliveries)))
        return batch


class TestWhichReadsLookBehind:
    async def test_after_a_busy_read_and_once_a_second_a_read_looks_behind(
        self,
    ) -> None:
        h = Harness()
        source = source_of(h, RecordingSource)
        job, busy = "job-1", LOOK_BEHIND_AFTER_ENTRIES

        async def route(*events: tuple[str, int]) -> None:
            for job_id, seq in events:
                h.xadd(job_id, seq)
            for job_id, seq in events:
                await eventually(lambda j=job_id, s=seq: s in h.published_seqs(j))

        async with running(h.consume_loop(source)):
            await eventually(h.groups_ready)
            # The first read looks behind; the ones after it, within the second, do not.
            await eventually(lambda: source.calls[:1] == [True] and False in source.calls)
            await route((job, 1))
            await route((job, 2))
            await route(*((job, seq) for seq in range(3, 3 + busy)))
            await route((job, 3 + busy))
            await route((job, 4 + busy))
            before_the_second = len(source.calls)
            h.clock.advance(int(LOOK_BEHIND_EVERY_S * 1000))
            # Nothing comes, yet a read looks behind (the one under way when the second
            # passed had decided not to; the next one does).
            await eventually(lambda: True in source.calls[before_the_second:])
            await route((job, 5 + busy))

        assert source.reads[:5] == [
            (False, 1),
            (False, 1),
            (False, busy),
            (True, 1),  # the read before was busy
            (False, 1),
        ]
        assert h.published_seqs(job) == list(range(1, 6 + busy))
        assert h.pending() == {}
