"""The `Broadcaster` contract: per-job channels, order, and failures as port errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from eco_router.application.errors import BroadcastFailed, TransientError
from eco_router.application.ports import Broadcaster
from tests.contracts.factories import ContractFamilies, entry_id

PREFIX = "progress"

Receive = Callable[[], Awaitable[bytes]]


class BroadcasterContract(ContractFamilies):
    """Every `Broadcaster` adapter, publishing on `{PREFIX}:{job_id}`.

    Subclasses wire a backend and implement the hooks below.
    """

    async def make_broadcaster(self) -> Broadcaster:
        """A broadcaster with channel prefix `PREFIX`."""
        raise NotImplementedError

    async def subscribe(self, broadcaster: Broadcaster, channel: str) -> Receive:
        """Subscribe to `channel` (confirmed before returning); the result awaits the next
        payload and fails the test when none comes within a few seconds."""
        raise NotImplementedError

    async def cut_server(self, broadcaster: Broadcaster) -> None:
        """Make the Pub/Sub server unreachable for `broadcaster`."""
        raise NotImplementedError

    async def test_payloads_arrive_on_their_jobs_channel_in_order(self) -> None:
        broadcaster = await self.make_broadcaster()
        job_a = await self.subscribe(broadcaster, f"{PREFIX}:job-a")
        job_b = await self.subscribe(broadcaster, f"{PREFIX}:job-b")
        a1, a2, a3 = (self.encoded(job_id="job-a", seq=n, stream_id=entry_id(n)) for n in (1, 2, 3))
        b1 = self.encoded(job_id="job-b", seq=1, stream_id=entry_id(4))
        b2 = self.encoded(job_id="job-b", seq=2, stream_id=entry_id(5))

        await broadcaster.broadcast([a1, b1, a2, a3])
        await broadcaster.broadcast([b2])

        assert [await job_a() for _ in range(3)] == [a1.payload, a2.payload, a3.payload]
        assert [await job_b() for _ in range(2)] == [b1.payload, b2.payload]

    async def test_a_large_batch_arrives_complete_and_in_order(self) -> None:
        broadcaster = await self.make_broadcaster()
        receive = await self.subscribe(broadcaster, f"{PREFIX}:job-1")
        batch = [self.encoded(job_id="job-1", seq=n, stream_id=entry_id(n)) for n in range(2500)]

        await broadcaster.broadcast(batch)

        assert [await receive() for _ in batch] == [item.payload for item in batch]

    async def test_payload_bytes_arrive_unchanged(self) -> None:
        broadcaster = await self.make_broadcaster()
        receive = await self.subscribe(broadcaster, f"{PREFIX}:job-1")
        event = self.encoded(job_id="job-1", stage="déjà vu ✓")

        await broadcaster.broadcast([event])

        assert await receive() == event.payload

    async def test_ping_answers_while_the_server_is_up(self) -> None:
        broadcaster = await self.make_broadcaster()

        await broadcaster.ping()

    async def test_ping_raises_transient_error_when_the_server_is_down(self) -> None:
        broadcaster = await self.make_broadcaster()
        await self.cut_server(broadcaster)

        with pytest.raises(TransientError):
            await broadcaster.ping()

    async def test_a_broadcast_to_an_unreachable_server_raises_broadcast_failed(self) -> None:
        broadcaster = await self.make_broadcaster()
        await self.cut_server(broadcaster)

        with pytest.raises(BroadcastFailed):
            await broadcaster.broadcast([self.encoded(job_id="job-1")])
