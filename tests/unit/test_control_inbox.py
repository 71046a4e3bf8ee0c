"""A worker's inbox on the in-memory control store: cancelled, each message at least once
until acknowledged, a restarted reader getting the unacknowledged again, nothing after the
job's end, waits that end."""

from __future__ import annotations

import asyncio

import pytest

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.control_store import InMemoryControlStore
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.control_inbox import ControlInbox
from eco_router.domain.control import ControlMessage
from tests.contracts.control_store import cancel, record, reply
from tests.contracts.factories import CHAT, GROUP, encoded

JOB = "job-1"
STREAM = CHAT.stream_for(JOB)


class Backend:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.streams = InMemoryStreams(self.clock)
        self.streams.lease_table(GROUP).epochs[STREAM] = 1
        self.states = InMemoryStateStore(
            clock=self.clock,
            streams=self.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=10,
        )
        self.store = InMemoryControlStore(
            streams=self.streams, states=self.states, families=[CHAT], state_ttl_s=3600,
            clock=self.clock,
        )  # fmt: skip

    def inbox(self) -> ControlInbox:
        """A worker's inbox, as a (re)started worker opens it."""
        return ControlInbox(self.store, "chat")

    async def end(self) -> None:
        done = encoded(domain="chat", stream=STREAM, job_id=JOB, seq=181, stage="done",
                       status="cancelled")  # fmt: skip
        await self.states.apply([done], {STREAM: 1})


@pytest.fixture
def backend() -> Backend:
    return Backend()


async def taken(inbox: ControlInbox, count: int) -> list[ControlMessage]:
    out = []
    async with asyncio.timeout(10):
        async for message in inbox.messages(JOB):
            out.append(message)
            if len(out) == count:
                break
    return out


class TestCancelled:
    async def test_a_job_is_cancelled_once_a_cancel_is_recorded(self, backend: Backend) -> None:
        inbox = backend.inbox()
        assert not await inbox.cancelled(JOB)

        await record(backend.store, cancel())

        assert await inbox.cancelled(JOB)

    async def test_an_input_is_no_cancel(self, backend: Backend) -> None:
        await record(backend.store, reply("oui", "a"))

        assert not await backend.inbox().cancelled(JOB)


class TestMessages:
    async def test_each_message_once_in_order_to_one_reader(self, backend: Backend) -> None:
        await record(backend.store, reply("a", "1"))
        await record(backend.store, cancel("2"))

        messages = await taken(backend.inbox(), 2)

        assert [(m.kind.value, m.number) for m in messages] == [("input", 1), ("cancel", 2)]

    async def test_a_reader_waits_for_a_message_recorded_later(self, backend: Backend) -> None:
        inbox = backend.inbox()
        reading = asyncio.create_task(taken(inbox, 1))
        await asyncio.sleep(0.01)
        assert not reading.done()

        await record(backend.store, reply("late", "1"))

        assert [m.body for m in await reading] == [{"input": "late"}]

    async def test_a_restarted_reader_gets_the_unacknowledged_again(self, backend: Backend) -> None:
        await record(backend.store, reply("a", "1"))
        await record(backend.store, reply("b", "2"))
        first, _ = await taken(backend.inbox(), 2)
        await backend.inbox().acknowledge(first)

        again = await taken(backend.inbox(), 1)

        assert [(m.body, m.deliveries) for m in again] == [({"input": "b"}, 2)]

    async def test_next_is_the_same_message_until_acknowledged(self, backend: Backend) -> None:
        inbox = backend.inbox()
        await record(backend.store, reply("a", "1"))
        await record(backend.store, reply("b", "2"))

        first = await inbox.next(JOB, timeout_s=1)
        same = await inbox.next(JOB, timeout_s=1)
        assert first is not None
        await inbox.acknowledge(first)
        then = await inbox.next(JOB, timeout_s=1)

        assert first.message_id == (same.message_id if same else None)
        assert then is not None
        assert then.body == {"input": "b"}

    async def test_nothing_is_handed_once_the_job_has_ended(self, backend: Backend) -> None:
        await record(backend.store, reply("a", "1"))
        await backend.end()

        async with asyncio.timeout(10):
            handed = [m async for m in backend.inbox().messages(JOB)]

        assert handed == []

    async def test_a_reader_ends_when_the_job_ends_while_it_waits(self, backend: Backend) -> None:
        reading = asyncio.create_task(taken(backend.inbox(), 1))
        await asyncio.sleep(0.01)

        await backend.end()

        assert await reading == []

    async def test_next_is_none_after_its_timeout(self, backend: Backend) -> None:
        # A short timeout: what is tested is that the wait ends, not how long it takes.
        assert await backend.inbox().next(JOB, timeout_s=0.05) is None

    async def test_a_read_without_waiting_sees_a_cancel_after_many_acknowledged(
        self, backend: Backend
    ) -> None:
        for n in range(150):
            message_id = await record(backend.store, reply(str(n), f"r{n}"))
            await backend.store.acknowledge("chat", JOB, message_id)
        await record(backend.store, cancel("stop"))

        found = await backend.inbox().next(JOB, timeout_s=0)

        assert found is not None
        assert found.request_id == "stop"

    async def test_a_read_without_waiting_hands_more_than_a_page(self, backend: Backend) -> None:
        for n in range(150):
            await record(backend.store, reply(str(n), f"r{n}"))

        handed = [m.number async for m in backend.inbox().messages(JOB, timeout_s=0)]

        assert handed == list(range(1, 151))
