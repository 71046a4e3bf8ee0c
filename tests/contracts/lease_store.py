"""The `LeaseStore` contract: live routers, leases with a TTL, fencing tokens."""

from __future__ import annotations

import pytest

from eco_router.application.errors import TransientError
from eco_router.application.ports import LeaseStore
from tests.contracts.factories import ContractFamilies

TTL_MS = 300


class LeaseStoreContract(ContractFamilies):
    """Every `LeaseStore` adapter over the class's `families`, TTL `TTL_MS`.

    Subclasses wire a backend and implement the hooks below.
    """

    async def make_store(self) -> LeaseStore:
        """A store of the group's leases on the shards of `families`, with a TTL of `TTL_MS`."""
        raise NotImplementedError

    async def let_time_pass(self, ms: int) -> None:
        """Make at least `ms` milliseconds pass on the backend's clock."""
        raise NotImplementedError

    async def cut_server(self) -> None:
        """Make the server unreachable."""
        raise NotImplementedError

    # routers

    async def test_a_heartbeat_marks_the_router_alive_for_one_ttl(self) -> None:
        store = await self.make_store()

        view = await store.heartbeat("router-a", {})

        assert list(view.routers) == ["router-a"]
        assert view.now_ms < view.routers["router-a"] <= view.now_ms + TTL_MS
        assert view.leases == {}

    async def test_a_router_without_heartbeat_lapses_after_the_ttl(self) -> None:
        store = await self.make_store()
        await store.heartbeat("router-a", {})
        await self.let_time_pass(TTL_MS + 50)

        view = await store.heartbeat("router-b", {})

        assert list(view.routers) == ["router-b"]

    async def test_a_router_that_leaves_is_gone_at_once(self) -> None:
        store = await self.make_store()
        await store.heartbeat("router-a", {})
        await store.heartbeat("router-b", {})

        await store.leave("router-a")

        assert list((await store.view()).routers) == ["router-b"]

    # leases

    async def test_a_free_shard_is_acquired_with_a_first_token(self) -> None:
        store = await self.make_store()

        lease = await store.acquire(self.scan_0, "router-a")

        assert lease is not None
        assert (lease.owner, lease.token) == ("router-a", 1)
        assert lease.since_ms < lease.expires_ms <= lease.since_ms + TTL_MS
        assert {s: (x.owner, x.token) for s, x in (await store.view()).leases.items()} == {
            self.scan_0: ("router-a", 1)
        }

    async def test_a_held_shard_cannot_be_acquired_by_another_router(self) -> None:
        store = await self.make_store()
        await store.acquire(self.scan_0, "router-a")

        assert await store.acquire(self.scan_0, "router-b") is None
        assert await store.acquire(self.scan_0, "router-a") is None

    async def test_a_lapsed_lease_goes_to_the_next_router_with_a_higher_token(self) -> None:
        store = await self.make_store()
        await store.acquire(self.scan_0, "router-a")
        await self.let_time_pass(TTL_MS + 50)

        lease = await store.acquire(self.scan_0, "router-b")

        assert lease is not None
        assert (lease.owner, lease.token) == ("router-b", 2)

    async def test_a_heartbeat_renews_the_leases_held_with_their_token(self) -> None:
        store = await self.make_store()
        first = await store.acquire(self.scan_0, "router-a")
        assert first is not None
        # Late in the lease, so the renewed one outlives the first by most of a TTL: on a busy
        # machine a slow call or a late wake-up must not eat the margin the check relies on.
        await self.let_time_pass(TTL_MS * 3 // 4)

        view = await store.heartbeat("router-a", {self.scan_0: first.token})
        await self.let_time_pass(max(0, first.expires_ms - view.now_ms) + 20)

        assert view.leases[self.scan_0].expires_ms > first.expires_ms
        assert view.leases[self.scan_0].since_ms == first.since_ms
        assert await store.acquire(self.scan_0, "router-b") is None

    async def test_a_lapsed_lease_nobody_took_is_renewed_under_the_same_token(self) -> None:
        store = await self.make_store()
        first = await store.acquire(self.scan_0, "router-a")
        assert first is not None
        await self.let_time_pass(TTL_MS + 50)

        view = await store.heartbeat("router-a", {self.scan_0: first.token})

        assert (view.leases[self.scan_0].owner, view.leases[self.scan_0].token) == ("router-a", 1)

    async def test_a_heartbeat_with_an_old_token_renews_nothing_and_shows_the_holder(
        self,
    ) -> None:
        store = await self.make_store()
        await store.acquire(self.scan_0, "router-a")
        await self.let_time_pass(TTL_MS + 50)
        await store.acquire(self.scan_0, "router-b")

        view = await store.heartbeat("router-a", {self.scan_0: 1})

        assert (view.leases[self.scan_0].owner, view.leases[self.scan_0].token) == ("router-b", 2)

    async def test_a_release_frees_the_shard_and_the_next_token_is_higher(self) -> None:
        store = await self.make_store()
        await store.acquire(self.chat_0, "router-a")

        await store.release(self.chat_0, "router-a", 1)
        lease = await store.acquire(self.chat_0, "router-b")

        assert lease is not None
        assert (lease.owner, lease.token) == ("router-b", 2)

    async def test_a_release_with_an_old_token_leaves_the_new_holder_alone(self) -> None:
        store = await self.make_store()
        await store.acquire(self.scan_1, "router-a")
        await self.let_time_pass(TTL_MS + 50)
        await store.acquire(self.scan_1, "router-b")

        await store.release(self.scan_1, "router-a", 1)

        assert (await store.view()).leases[self.scan_1].owner == "router-b"

    async def test_shards_are_leased_independently(self) -> None:
        store = await self.make_store()

        leases = [
            await store.acquire(s, "router-a") for s in (self.scan_0, self.scan_1, self.chat_0)
        ]

        assert [lease.token if lease else None for lease in leases] == [1, 1, 1]
        assert sorted((await store.view()).leases) == sorted(
            [self.scan_0, self.scan_1, self.chat_0]
        )

    # availability

    async def test_an_unreachable_server_raises_transient_errors(self) -> None:
        store = await self.make_store()
        await self.cut_server()

        with pytest.raises(TransientError):
            await store.heartbeat("router-a", {})
        with pytest.raises(TransientError):
            await store.acquire(self.scan_0, "router-a")
