"""ReclaimPending: taking over what a crashed or stuck consumer left pending."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from eco_router.adapters.memory.broadcaster import InMemoryBroadcaster
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.application.errors import TransientError
from eco_router.application.port_values import Applied, ClaimPage, EncodedEvent, ReadStart
from eco_router.application.reclaim_pending import ReclaimPending
from eco_router.application.router_health import RouterHealth
from tests.unit.factories import CHANNEL_PREFIX, FAMILY, GROUP, Harness, eventually

MIN_IDLE_MS = 30_000


@pytest.fixture
async def h() -> Harness:
    harness = Harness(consumer="a")
    await harness.source.prepare()
    return harness


@pytest.fixture
def b(h: Harness) -> InMemoryEventSource:
    """A second consumer of the same group, on the same streams."""
    return h.consumer_source("b")


async def crash_after_reading(h: Harness) -> list[str]:
    """Consumer A reads every new entry and dies before routing or acking any."""
    return [d.entry_id for d in await h.read()]


async def crash_after_claiming(b: InMemoryEventSource) -> None:
    """Consumer B claims every idle entry of job-1's shard and dies before routing any."""
    stream = FAMILY.stream_for("job-1")
    await b.claim(stream, token=1, cursor="0-0", min_idle_ms=MIN_IDLE_MS, count=100)


async def passes_while_pubsub_is_down(h: Harness, reclaim: ReclaimPending) -> None:
    """More reclaim passes than `max_deliveries`, each after the idle time, Pub/Sub down."""
    h.broadcaster.available = False
    for _ in range(h.max_deliveries + 2):
        h.clock.advance(MIN_IDLE_MS)
        with pytest.raises(TransientError):
            await reclaim()


class DownAfterPing(InMemoryBroadcaster):
    """A Pub/Sub server that answers the first ping, then goes down before the publish."""

    def __init__(self, *, channel_prefix: str) -> None:
        super().__init__(channel_prefix=channel_prefix)
        self.pinged = False

    async def ping(self) -> None:
        await super().ping()
        if not self.pinged:
            self.pinged = True
            self.available = False


class TestTakingOver:
    async def test_entries_a_crashed_consumer_left_are_routed_and_acked(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        h.xadd("job-1", 1)
        h.xadd("job-1", 2)
        h.xadd("job-2", 1)
        taken = await crash_after_reading(h)
        assert {p.consumer for p in h.pending().values()} == {"a"}
        h.clock.advance(MIN_IDLE_MS)

        claimed = await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)()

        assert claimed == len(taken) == 3
        assert h.published_seqs("job-1") == [1, 2]
        assert h.published_seqs("job-2") == [1]
        assert h.pending() == {}
        assert h.metrics.reclaimed_entries == Counter({("scan", 2): 2, ("scan", 3): 1})

    async def test_entries_not_idle_long_enough_are_left_with_their_owner(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        h.xadd("job-1", 1)
        taken = await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS - 1)

        claimed = await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)()

        assert claimed == 0
        assert h.broadcaster.sent == []
        assert {i: (p.consumer, p.count) for i, p in h.pending().items()} == {taken[0]: ("a", 1)}

    async def test_only_the_entries_idle_long_enough_are_taken(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        h.xadd("job-1", 1)
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS // 2)
        h.xadd("job-2", 1)
        young = await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS // 2)

        claimed = await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)()

        assert claimed == 1
        assert h.published_seqs("job-1") == [1]
        assert h.published_seqs("job-2") == []
        assert set(h.pending()) == set(young)

    async def test_nothing_pending_claims_nothing(self, h: Harness, b: InMemoryEventSource) -> None:
        h.xadd("job-1", 1)
        await h.route(await h.read())
        h.clock.advance(MIN_IDLE_MS)

        claimed = await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)()

        assert claimed == 0
        assert h.published_seqs("job-1") == [1]
        assert h.metrics.reclaimed_entries == Counter()

    async def test_every_entry_is_reached_when_pages_are_smaller_than_the_pending_list(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        for seq in range(1, 8):
            h.xadd("job-1", seq)
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS)

        claimed = await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS, page_size=2)()

        assert claimed == 7
        assert h.published_seqs("job-1") == list(range(1, 8))
        assert h.pending() == {}

    async def test_paging_skips_young_entries_without_stopping(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        old = [h.xadd("job-1", 1), h.xadd("job-1", 2)]
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS)
        young = [h.xadd("job-1", 3), h.xadd("job-1", 4)]
        await crash_after_reading(h)
        h.clock.advance(1)
        youngest = [h.xadd("job-1", 5)]
        await crash_after_reading(h)
        # Only the first two are idle long enough; a page of one keeps paging past the young ones.
        claimed = await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS, page_size=1)()

        assert claimed == len(old)
        assert h.published_seqs("job-1") == [1, 2]
        assert set(h.pending()) == set(young + youngest)


class TestEntriesThatCannotBeRouted:
    async def test_an_entry_deleted_while_pending_is_counted_trimmed_and_leaves_the_list(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        kept = h.xadd("job-1", 1)
        deleted = h.xadd("job-1", 2)
        await crash_after_reading(h)
        h.streams.delete_entry("scan:events:2", deleted)
        h.clock.advance(MIN_IDLE_MS)

        await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)()

        assert kept not in h.pending()
        assert h.pending() == {}
        assert h.metrics.trimmed == Counter({("scan", 2): 1})
        assert h.published_seqs("job-1") == [1]
        assert h.dead_lettered() == []

    async def test_an_entry_redelivered_more_than_max_times_is_dead_lettered(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        entry_id = h.xadd("job-1", 1)
        await crash_after_reading(h)  # delivery 1
        for delivery in range(2, h.max_deliveries + 1):
            h.clock.advance(MIN_IDLE_MS)
            await crash_after_claiming(b)
            assert h.pending()[entry_id].count == delivery
        h.clock.advance(MIN_IDLE_MS)

        await h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)()

        [letter] = h.dead_lettered()
        assert letter[b"id"] == entry_id.encode()
        assert letter[b"reason"] == b"max_deliveries"
        assert letter[b"deliveries"] == str(h.max_deliveries + 1).encode()
        assert h.pending() == {}
        assert h.broadcaster.sent == []

    async def test_a_failed_publish_is_routed_again_without_claiming_the_entry_again(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        entry_id = h.xadd("job-1", 1)
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS)
        h.broadcaster = DownAfterPing(channel_prefix=CHANNEL_PREFIX)
        reclaim = h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)
        passing = asyncio.create_task(reclaim())
        await eventually(lambda: h.metrics.publish_errors >= h.max_deliveries + 2)
        assert h.pending()[entry_id].consumer == "b"
        h.broadcaster.available = True

        assert await passing == 1

        assert h.published_seqs("job-1") == [1]
        assert await h.history_seqs("job-1") == [1]
        assert h.pending() == {}
        assert h.dead_lettered() == []


class TestWhilePubSubIsDown:
    async def test_nothing_is_claimed_and_no_delivery_is_counted(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        entry_id = h.xadd("job-1", 1)
        await crash_after_reading(h)
        reclaim = h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)

        await passes_while_pubsub_is_down(h, reclaim)

        assert h.pending()[entry_id].consumer == "a"
        assert h.pending()[entry_id].count == 1
        assert h.metrics.reclaimed_entries == Counter()

    async def test_the_first_pass_after_it_returns_routes_what_waited(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        h.xadd("job-1", 1)
        h.xadd("job-1", 2)
        await crash_after_reading(h)
        reclaim = h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)
        await passes_while_pubsub_is_down(h, reclaim)
        h.broadcaster.available = True

        claimed = await reclaim()

        assert claimed == 2
        assert h.published_seqs("job-1") == [1, 2]
        assert h.dead_lettered() == []
        assert h.pending() == {}


class CountingStore(InMemoryStateStore):
    """A state store that counts the batches it was asked to apply."""

    attempts = 0

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        self.attempts += 1
        return await super().apply(events, fence, in_order)


class TestWhileTheStoreRefusesWrites:
    """Redis out of memory: every apply fails transiently until memory frees."""

    async def test_a_long_episode_dead_letters_no_valid_event(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        store = CountingStore(
            clock=h.clock,
            streams=h.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=100,
        )
        h.store = store
        entry_id = h.xadd("job-1", 1)
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS)
        store.available = False
        passing = asyncio.create_task(h.reclaimer(b, min_idle_ms=MIN_IDLE_MS)())
        await eventually(lambda: store.attempts > h.max_deliveries + 2)
        assert h.pending()[entry_id].count == 2
        store.available = True

        assert await passing == 1

        assert h.published_seqs("job-1") == [1]
        assert h.dead_lettered() == []
        assert h.pending() == {}

    async def test_nothing_is_claimed_while_the_consumer_retries_a_batch(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        entry_id = h.xadd("job-1", 1)
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS)
        health = RouterHealth(clock=h.clock, metrics=h.metrics)
        health.troubled("consumer", TransientError("OOM command not allowed"))
        reclaim = ReclaimPending(
            source=b,
            broadcaster=h.broadcaster,
            route=h.route_batch(b),
            held=h.held_shards(),
            metrics=h.metrics,
            clock=h.clock,
            min_idle_ms=MIN_IDLE_MS,
            page_size=100,
            health=health,
        )

        assert await reclaim() == 0

        assert h.pending()[entry_id].consumer == "a"
        assert h.pending()[entry_id].count == 1


class ClaimsCutOff(InMemoryEventSource):
    """A source whose claims on the `cut_off` shards fail transiently (a node unreachable)."""

    cut_off: frozenset[str] = frozenset()

    async def claim(
        self, stream: str, *, token: int, cursor: str, min_idle_ms: int, count: int
    ) -> ClaimPage:
        if stream in self.cut_off:
            raise TransientError(f"claim on {stream}: connection refused")
        return await super().claim(
            stream, token=token, cursor=cursor, min_idle_ms=min_idle_ms, count=count
        )


class TestAShardThatFails:
    async def test_a_shard_of_the_wrong_type_is_quarantined_and_the_others_reclaimed(
        self, h: Harness, b: InMemoryEventSource
    ) -> None:
        jobs = {FAMILY.stream_for(f"job-{n}"): f"job-{n}" for n in range(40)}
        for job in jobs.values():
            h.xadd(job, 1)
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS)
        broken = FAMILY.streams[0]
        h.streams.break_shard(broken)
        health = RouterHealth(clock=h.clock, metrics=h.metrics, families=[FAMILY])
        reclaim = ReclaimPending(
            source=b,
            broadcaster=h.broadcaster,
            route=h.route_batch(b),
            held=h.held_shards(),
            metrics=h.metrics,
            clock=h.clock,
            min_idle_ms=MIN_IDLE_MS,
            page_size=100,
            health=health,
        )

        assert await reclaim() == len(jobs) - 1

        assert all(h.published_seqs(j) == [1] for s, j in jobs.items() if s != broken)
        assert f"shard {broken}" in health.checks()
        assert (FAMILY.domain, 0) in h.metrics.quarantined

    async def test_a_shard_that_fails_transiently_fails_the_pass_after_the_others(
        self, h: Harness
    ) -> None:
        jobs = {FAMILY.stream_for(f"job-{n}"): f"job-{n}" for n in range(40)}
        for job in jobs.values():
            h.xadd(job, 1)
        await crash_after_reading(h)
        h.clock.advance(MIN_IDLE_MS)
        cut_off = FAMILY.streams[0]
        b = ClaimsCutOff(h.streams, families=[FAMILY], group=GROUP, consumer="b")
        b.cut_off = frozenset({cut_off})
        health = RouterHealth(clock=h.clock, metrics=h.metrics, families=[FAMILY])
        reclaim = ReclaimPending(
            source=b,
            broadcaster=h.broadcaster,
            route=h.route_batch(b),
            held=h.held_shards(),
            metrics=h.metrics,
            clock=h.clock,
            min_idle_ms=MIN_IDLE_MS,
            page_size=100,
            health=health,
        )

        # Raised, so that its loop retries it with back-off rather than at its next interval.
        with pytest.raises(TransientError):
            await reclaim()

        assert all(h.published_seqs(j) == [1] for s, j in jobs.items() if s != cut_off)
        assert health.troubled_now("reclaimer")
        b.cut_off = frozenset()
        assert await reclaim() == 1
        assert not health.troubled_now("reclaimer")
