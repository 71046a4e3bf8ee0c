"""The `PresenceBoard` contract: gateways' viewer counts, renewed by posts, lapsing after a TTL."""

from __future__ import annotations

from eco_router.application.ports import PresenceBoard

# Short so that a lapse takes a fraction of a second on a real server: what lapses, and when
# in proportion to the TTL, does not depend on the TTL's length.
TTL_S = 0.3


class PresenceBoardContract:
    """Every `PresenceBoard` adapter, its TTL `TTL_S`. Subclasses wire a backend."""

    async def make_board(self) -> PresenceBoard:
        """A fresh board whose counts lapse `TTL_S` after their gateway's last post."""
        raise NotImplementedError

    async def let_time_pass(self, seconds: float) -> None:
        """Make at least `seconds` pass on the backend's clock."""
        raise NotImplementedError

    async def test_a_job_nobody_watches_has_no_viewers(self) -> None:
        board = await self.make_board()

        assert await board.viewers("scan", "job-1") == {}

    async def test_each_gateway_counts_its_own_viewers_of_a_job(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3, ("scan", "job-2"): 1}, whole=True)
        await board.post("gw-b", {("scan", "job-1"): 1}, whole=True)

        assert await board.viewers("scan", "job-1") == {"gw-a": 3, "gw-b": 1}
        assert await board.viewers("scan", "job-2") == {"gw-a": 1}
        assert await board.viewers("chat", "job-1") == {}

    async def test_changes_update_and_a_zero_removes_a_job(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3, ("scan", "job-2"): 1}, whole=True)

        assert await board.post("gw-a", {("scan", "job-1"): 2, ("scan", "job-2"): 0}, whole=False)

        assert await board.viewers("scan", "job-1") == {"gw-a": 2}
        assert await board.viewers("scan", "job-2") == {}

    async def test_a_whole_post_replaces_every_count(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3}, whole=True)

        await board.post("gw-a", {("scan", "job-2"): 1}, whole=True)

        assert await board.viewers("scan", "job-1") == {}
        assert await board.viewers("scan", "job-2") == {"gw-a": 1}

    async def test_changes_to_counts_never_posted_are_refused(self) -> None:
        board = await self.make_board()

        assert not await board.post("gw-a", {("scan", "job-1"): 1}, whole=False)

        assert await board.viewers("scan", "job-1") == {}

    async def test_a_gateway_that_stops_posting_lapses_after_the_ttl(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3}, whole=True)
        await board.post("gw-b", {("scan", "job-1"): 1}, whole=True)
        await self.let_time_pass(TTL_S * 0.6)
        await board.post("gw-b", {}, whole=False)
        await self.let_time_pass(TTL_S * 0.6)

        assert await board.viewers("scan", "job-1") == {"gw-b": 1}
        # Its counts are gone: changes to them are refused, a whole post starts again.
        assert not await board.post("gw-a", {("scan", "job-2"): 1}, whole=False)

    async def test_a_post_without_changes_keeps_the_counts_alive(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3}, whole=True)
        for _ in range(3):
            await self.let_time_pass(TTL_S * 0.5)
            assert await board.post("gw-a", {}, whole=False)

        assert await board.viewers("scan", "job-1") == {"gw-a": 3}

    async def test_a_gateway_with_no_viewers_left_stays_live(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 1}, whole=True)
        await board.post("gw-a", {("scan", "job-1"): 0}, whole=False)

        assert await board.post("gw-a", {("scan", "job-1"): 2}, whole=False)

        assert await board.viewers("scan", "job-1") == {"gw-a": 2}

    async def test_a_gateway_that_leaves_is_gone_at_once(self) -> None:
        board = await self.make_board()
        await board.post("gw-a", {("scan", "job-1"): 3}, whole=True)
        await board.post("gw-b", {("scan", "job-1"): 1}, whole=True)

        await board.leave("gw-a")
        await board.leave("gw-a")

        assert await board.viewers("scan", "job-1") == {"gw-b": 1}
