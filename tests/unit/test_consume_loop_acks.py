"""ConsumeLoop acks: they ride on the next round trip to the streams server, never lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.errors import TransientError
from eco_router.application.held_shards import HeldShards
from eco_router.application.messages import ClaimPage, Delivery, ReadBatch
from tests.unit.factories import GROUP, Harness, eventually


class CountingSource(InMemoryEventSource):
    """Counts the calls that reach the server and which of them carried acks; can lose the
    reply of the next read that brings entries, after the server has done its work."""

    lose_next_read = False
    cut_next_read = False  # the next read carrying acks fails before reaching the server
    slow_s = 0.0  # how long a call carrying acks takes before the server sees it

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[str] = []
        self.carried = 0

    async def read_new(
        self,
        after: Mapping[str, str],
        *,
        count: int,
        acks: Sequence[Delivery] = (),
        block_ms: int = 0,
        look_behind: bool = True,
    ) -> ReadBatch:
        self.calls.append("read_new")
        self.carried += len(acks)
        if acks:
            await asyncio.sleep(self.slow_s)
            if self.cut_next_read:
                self.cut_next_read = False
                raise TransientError("connection reset before the server saw the read")
        batch = await super().read_new(
            after, count=count, acks=acks, block_ms=block_ms, look_behind=look_behind
        )
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


def counting_source(h: Harness) -> CountingSource:
    return CountingSource(h.streams, families=[h.family], group=GROUP, consumer=h.consumer)


async def run_until(h: Harness, source: CountingSource, done: object) -> None:
    """Run the loop until `done()` holds, then stop it and wait for its end."""
    stop = asyncio.Event()
    task = asyncio.create_task(h.consume_loop(source).run(stop))
    try:
        await eventually(h.groups_ready)
        await eventually(lambda: "read_new" in source.calls)
        await done()  # type: ignore[operator]
    finally:
        stop.set()
        async with asyncio.timeout(5.0):
            await task


class TestAcksRideOnTheNextRoundTrip:
    async def test_events_arriving_one_by_one_are_acked_without_a_round_trip_of_their_own(
        self,
    ) -> None:
        h = Harness()
        source = counting_source(h)

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
        source = counting_source(h)
        source.slow_s = 1.0  # stop comes while the wait carrying the ack is on its way
        stop = asyncio.Event()
        loop = h.consume_loop(source)
        task = asyncio.create_task(loop.run(stop))
        await eventually(h.groups_ready)
        h.xadd("job-1", 1)
        await eventually(lambda: h.published_seqs("job-1") == [1])

        stop.set()
        async with asyncio.timeout(5.0):
            await task

        assert h.pending() == {}

    async def test_owed_acks_land_before_a_claim_so_nothing_is_published_twice(self) -> None:
        h = Harness()
        source = counting_source(h)

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
        source = counting_source(h)

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
        source = counting_source(h)
        source.slow_s = 0.2
        held = ReportingHeld()
        for stream, token in h.fence.items():
            held.gain(stream, token, since_ms=0, now_s=0.0)
            held.took_over(stream)
        held.pending_on = lambda stream: h.streams.pending(stream, GROUP)
        stop = asyncio.Event()
        task = asyncio.create_task(h.consume_loop(source, held=held).run(stop))
        try:
            await eventually(h.groups_ready)
            stream = h.family.stream_for("job-1")
            h.xadd("job-1", 1)
            await eventually(lambda: h.published_seqs("job-1") == [1])

            held.start_release(stream)

            await eventually(lambda: stream in held.drained())
            assert held.drained_while_pending == []
        finally:
            stop.set()
            async with asyncio.timeout(5.0):
                await task
