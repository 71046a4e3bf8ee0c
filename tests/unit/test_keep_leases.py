"""KeepLeases: the heartbeat that holds this router's share of the shards, on in-memory leases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from eco_router.adapters.memory.leases import InMemoryLeaseStore
from eco_router.application.held_shards import HeldShards, Phase
from eco_router.application.keep_leases import KeepLeases
from tests.unit.factories import FAMILY, LEASE_TTL_MS, Harness, eventually

SHARDS = FAMILY.streams


@dataclass
class Keeper:
    """One router's lease keeper running in a task, with the store it talks to."""

    name: str
    held: HeldShards
    store: InMemoryLeaseStore
    keeper: KeepLeases
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def holding(self) -> set[str]:
        return set(self.held.streams())

    def phase(self, stream: str) -> Phase | None:
        held = self.held.get(stream)
        return None if held is None else held.phase

    def rounds_done(self) -> int:
        """The lease store's clock at this keeper's last heartbeat."""
        return -1 if self.keeper.view is None else self.keeper.view.now_ms

    async def finish(self) -> None:
        """Stop and let it hand everything back (the consumer has drained)."""
        self.stop.set()
        self.drained.set()
        if self.task is not None:
            await self.task


class Group:
    """Lease keepers of one group on the harness's lease table; time moves by hand."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.keepers: list[Keeper] = []

    def start(self, name: str, *, stopping: bool = False) -> Keeper:
        held = HeldShards()
        store = self.h.lease_store()
        keeper = Keeper(name, held, store, self.h.lease_keeper(name, held, store))
        if stopping:
            keeper.stop.set()
        keeper.task = asyncio.create_task(keeper.keeper.run(keeper.stop, keeper.drained))
        self.keepers.append(keeper)
        return keeper

    def owners(self) -> dict[str, str]:
        """Stream → owner of every live lease in the table."""
        return {s: lease.owner for s in SHARDS if (lease := self.h.leases.live_lease(s))}

    async def until(self, condition: Callable[[], object], what: str = "condition") -> None:
        """Move the clock a millisecond at a time (a round each) until `condition` holds."""

        def tick() -> object:
            if condition():
                return True
            self.h.clock.advance(1)
            return False

        try:
            await eventually(tick)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}; leases {self.owners()}") from None

    async def rounds(self, count: int, *keepers: Keeper, step_ms: int = 1) -> None:
        """Move the clock `count` times by `step_ms`, each time until every one of `keepers`
        has had a heartbeat round since."""
        for _ in range(count):
            before = self.h.clock.now_ms()
            self.h.clock.advance(step_ms)
            await eventually(lambda t=before: all(k.rounds_done() > t for k in keepers))

    async def close(self) -> None:
        for keeper in self.keepers:
            keeper.store.available = True
            await keeper.finish()


@pytest.fixture
async def group() -> AsyncIterator[Group]:
    g = Group(Harness())
    yield g
    await g.close()


def split_evenly(*keepers: Keeper) -> bool:
    """Every shard held by exactly one keeper, shares differing by at most one."""
    holdings = [k.holding() for k in keepers]
    sizes = [len(h) for h in holdings]
    every = set().union(*holdings)
    return every == set(SHARDS) and sum(sizes) == len(SHARDS) and max(sizes) - min(sizes) <= 1


class TestTaking:
    async def test_a_lone_keeper_takes_every_free_shard_with_a_new_token(
        self, group: Group
    ) -> None:
        a = group.start("a")

        await group.until(lambda: a.holding() == set(SHARDS), "a holds every shard")

        # The harness's epochs start at 1: every acquisition fences out token 1.
        assert a.held.tokens() == dict.fromkeys(SHARDS, 2)
        assert group.owners() == dict.fromkeys(SHARDS, "a")
        assert all(a.phase(s) is Phase.TAKING_OVER for s in SHARDS)
        assert set(group.h.metrics.held) == {("scan", n) for n in range(4)}
        assert group.h.metrics.routers == 1

    async def test_leases_are_renewed_past_their_ttl(self, group: Group) -> None:
        a = group.start("a")
        await group.until(lambda: a.holding() == set(SHARDS))

        await group.rounds(3, a, step_ms=LEASE_TTL_MS // 2)

        assert group.owners() == dict.fromkeys(SHARDS, "a")
        assert a.held.tokens() == dict.fromkeys(SHARDS, 2)

    async def test_two_keepers_split_the_shards_evenly(self, group: Group) -> None:
        a = group.start("a")
        b = group.start("b")

        await group.until(lambda: split_evenly(a, b), "a and b hold two shards each")

        assert group.owners() == {
            **dict.fromkeys(a.holding(), "a"),
            **dict.fromkeys(b.holding(), "b"),
        }

    async def test_a_keeper_joining_late_gets_its_share_from_the_first(self, group: Group) -> None:
        a = group.start("a")
        await group.until(lambda: a.holding() == set(SHARDS))

        b = group.start("b")
        await group.until(lambda: split_evenly(a, b), "a hands two shards to b")

        # The first keeps its first shards; the moved ones were taken over with new tokens.
        assert a.holding() == set(SHARDS[:2])
        assert b.held.tokens() == dict.fromkeys(SHARDS[2:], 3)

    async def test_three_keepers_share_four_shards_two_one_one(self, group: Group) -> None:
        keepers = [group.start(name) for name in ("a", "b", "c")]

        await group.until(lambda: split_evenly(*keepers), "shares of 2, 1 and 1")

        assert sorted(len(k.holding()) for k in keepers) == [1, 1, 2]

    async def test_a_keeper_beyond_the_shard_count_stands_by(self, group: Group) -> None:
        keepers = [group.start(name) for name in ("a", "b", "c", "d")]
        await group.until(lambda: split_evenly(*keepers))
        standby = group.start("e")

        await group.rounds(3, standby, *keepers)

        assert standby.holding() == set()
        assert all(len(k.holding()) == 1 for k in keepers)


class TestLosing:
    async def test_a_keeper_whose_lease_was_taken_drops_the_shard_and_counts_it_lost(
        self, group: Group
    ) -> None:
        a = group.start("a")
        await group.until(lambda: a.holding() == set(SHARDS))
        a.store.available = False  # cut off from the streams server, still running
        group.h.clock.advance(LEASE_TTL_MS + 1)
        b = group.start("b")
        await group.until(lambda: b.holding() == set(SHARDS), "b takes the lapsed leases")
        assert a.holding() == set(SHARDS)  # a does not know yet
        assert group.h.metrics.leases_lost == {}

        a.store.available = True
        await group.until(lambda: not (a.holding() & b.holding()), "a sees its leases taken")

        assert group.h.metrics.leases_lost == {("scan", n): 1 for n in range(4)}
        await group.until(lambda: split_evenly(a, b), "a gets its share back from b")

    async def test_shards_of_a_router_cut_off_are_taken_only_once_its_lease_lapses(
        self, group: Group
    ) -> None:
        a = group.start("a")
        b = group.start("b")
        await group.until(lambda: split_evenly(a, b))
        a_shards = a.holding()
        await group.rounds(1, a, b)
        a.store.available = False
        last_renewal = group.h.clock.now_ms()

        group.h.clock.advance(LEASE_TTL_MS - 10)
        await group.rounds(3, b)
        assert b.holding().isdisjoint(a_shards)

        await group.until(lambda: b.holding() == set(SHARDS), "b takes over a's shards")
        assert group.h.clock.now_ms() >= last_renewal + LEASE_TTL_MS


class TestReleasing:
    async def test_a_shard_being_handed_over_is_released_only_once_nothing_is_in_hand(
        self, group: Group
    ) -> None:
        a = group.start("a")
        await group.until(lambda: a.holding() == set(SHARDS))
        busy, idle = SHARDS[2], SHARDS[3]  # a keeps the first two, gives these to b
        a.held.picked_up([busy])

        b = group.start("b")
        await group.until(lambda: idle in b.holding(), "b takes the idle shard")
        await group.rounds(3, a, b, step_ms=LEASE_TTL_MS // 2)

        assert a.phase(busy) is Phase.RELEASING
        assert group.owners()[busy] == "a"
        assert busy not in b.holding()

        a.held.put_down([busy])
        await group.until(lambda: busy in b.holding(), "b takes the drained shard")
        assert split_evenly(a, b)

    async def test_a_stopped_keeper_releases_everything_and_leaves(self, group: Group) -> None:
        a = group.start("a")
        b = group.start("b")
        await group.until(lambda: split_evenly(a, b))
        a_shards = a.holding()

        await a.finish()

        assert a.holding() == set()
        assert "a" not in group.h.leases.live_routers()
        assert set(group.owners()) == b.holding()
        # Released, not lapsed: b takes them without waiting out the TTL.
        before = group.h.clock.now_ms()
        await group.until(lambda: b.holding() == set(SHARDS), "b takes what a released")
        assert group.h.clock.now_ms() - before < LEASE_TTL_MS
        assert a_shards <= b.holding()

    async def test_a_stopping_keeper_takes_nothing_but_renews_what_it_holds(
        self, group: Group
    ) -> None:
        a = group.start("a")
        await group.until(lambda: a.holding() == set(SHARDS))
        a.stop.set()
        b = group.start("b", stopping=True)

        await group.rounds(3, a, b, step_ms=LEASE_TTL_MS // 2)

        assert a.holding() == set(SHARDS)
        assert b.holding() == set()
        assert group.owners() == dict.fromkeys(SHARDS, "a")

    async def test_a_keeper_that_cannot_reach_the_store_leaves_its_leases_to_lapse(
        self, group: Group
    ) -> None:
        a = group.start("a")
        await group.until(lambda: a.holding() == set(SHARDS))
        a.store.available = False

        await a.finish()

        assert group.owners() == dict.fromkeys(SHARDS, "a")
        group.h.clock.advance(LEASE_TTL_MS)
        assert group.owners() == {}
