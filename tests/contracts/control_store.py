"""The `ControlStore` contract: recording (once per request id, refused once the job ended),
the announcement in the job's shard stream, delivery until acknowledged, and waiting."""

from __future__ import annotations

import asyncio
import json

from eco_router.application.ports import ControlStore
from eco_router.domain.control import (
    ControlKind,
    ControlRequest,
    ControlState,
    Recorded,
    control_request,
    lifecycle_fields,
)
from tests.contracts.factories import ContractFamilies

JOB = "job-1"


def cancel(request_id: str = "r-1", job_id: str = JOB) -> ControlRequest:
    return control_request("chat", job_id, ControlKind.CANCEL, b'{"reason":"stop"}', request_id)


def reply(text: str, request_id: str, job_id: str = JOB) -> ControlRequest:
    body = json.dumps({"input": text}).encode()
    return control_request("chat", job_id, ControlKind.INPUT, body, request_id)


class ControlStoreContract(ContractFamilies):
    """Every `ControlStore` adapter, on the class's families (chat job-1 on `chat_0`)."""

    async def make_store(self) -> ControlStore:
        raise NotImplementedError

    async def end_job(self, job_id: str, *, stage: str = "done", status: str = "done") -> None:
        """Apply the job's terminal event to the backend's state, as a router does."""
        raise NotImplementedError

    async def shard_entries(self, stream: str) -> list[dict[str, str]]:
        """The fields of every entry of `stream`, in order."""
        raise NotImplementedError

    async def test_a_new_request_is_recorded_with_the_next_number(self) -> None:
        store = await self.make_store()
        first = await store.record(cancel("a"))
        second = await store.record(reply("oui", "b"))

        assert (first.outcome, first.number, first.kind) == (Recorded.NEW, 1, ControlKind.CANCEL)
        assert (second.outcome, second.number, second.kind) == (Recorded.NEW, 2, ControlKind.INPUT)
        assert first.message_id is not None
        assert first.message_id != second.message_id

    async def test_a_request_id_again_answers_the_first_receipt_and_adds_nothing(self) -> None:
        store = await self.make_store()
        first = await store.record(reply("oui", "a"))
        again = await store.record(reply("non", "a"))

        assert again.outcome is Recorded.DUPLICATE
        assert (again.message_id, again.number, again.kind) == (
            first.message_id,
            first.number,
            first.kind,
        )
        assert len(await store.messages("chat", JOB)) == 1
        assert len(await self.shard_entries(self.chat_0)) == 1

    async def test_a_request_for_a_job_that_ended_is_refused_and_writes_nothing(self) -> None:
        store = await self.make_store()
        await self.end_job(JOB)

        refused = await store.record(cancel())

        assert refused.outcome is Recorded.ENDED
        assert refused.message_id is None
        assert await store.messages("chat", JOB) == []
        assert not await store.cancelled("chat", JOB)

    async def test_a_failed_job_has_ended_too(self) -> None:
        store = await self.make_store()
        await self.end_job(JOB, stage="answer", status="failed")

        assert (await store.record(cancel())).outcome is Recorded.ENDED

    async def test_a_request_id_recorded_before_the_end_still_answers_its_receipt(self) -> None:
        store = await self.make_store()
        first = await store.record(cancel())
        await self.end_job(JOB)

        again = await store.record(cancel())

        assert (again.outcome, again.message_id) == (Recorded.DUPLICATE, first.message_id)

    async def test_the_announcement_joins_the_jobs_shard_stream(self) -> None:
        store = await self.make_store()
        request = reply("oui", "a")
        receipt = await store.record(request)
        assert receipt.message_id is not None

        (entry,) = await self.shard_entries(self.chat_0)

        expected = lifecycle_fields(request, receipt.message_id, 1, entry["ts"])
        assert entry == expected
        assert entry["stage"] == "input_received"

    async def test_a_worker_is_handed_every_unacknowledged_message_again(self) -> None:
        store = await self.make_store()
        first = await store.record(cancel("a"))
        second = await store.record(reply("oui", "b"))
        assert first.message_id is not None

        handed = await store.deliver("chat", JOB)
        await store.acknowledge("chat", JOB, first.message_id)
        again = await store.deliver("chat", JOB)

        assert [m.message_id for m in handed.messages] == [first.message_id, second.message_id]
        assert [m.deliveries for m in handed.messages] == [1, 1]
        assert [(m.message_id, m.deliveries) for m in again.messages] == [(second.message_id, 2)]
        assert again.messages[0].body == {"input": "oui"}
        assert again.messages[0].request_id == "b"
        assert again.last_id == second.message_id

    async def test_delivery_after_an_id_hands_only_later_messages(self) -> None:
        store = await self.make_store()
        first = await store.record(cancel("a"))
        second = await store.record(reply("oui", "b"))
        assert first.message_id is not None

        later = await store.deliver("chat", JOB, after=first.message_id)

        assert [m.message_id for m in later.messages] == [second.message_id]

    async def test_nothing_is_handed_once_the_job_has_ended(self) -> None:
        store = await self.make_store()
        await store.record(cancel())
        await self.end_job(JOB, status="cancelled")

        handed = await store.deliver("chat", JOB)

        assert handed.ended
        assert handed.messages == ()

    async def test_an_unknown_job_has_nothing_pending(self) -> None:
        store = await self.make_store()

        handed = await store.deliver("chat", "job-x")

        assert (handed.messages, handed.last_id, handed.ended) == ((), "0-0", False)

    async def test_acknowledging_an_unknown_message_is_false(self) -> None:
        store = await self.make_store()

        assert not await store.acknowledge("chat", JOB, "1-0")

    async def test_a_cancel_is_known_at_once_and_an_input_is_no_cancel(self) -> None:
        store = await self.make_store()
        await store.record(reply("oui", "a"))
        assert not await store.cancelled("chat", JOB)

        await store.record(cancel("b"))

        assert await store.cancelled("chat", JOB)
        assert not await store.cancelled("chat", "job-2")

    async def test_messages_show_each_state(self) -> None:
        store = await self.make_store()
        first = await store.record(cancel("a"))
        await store.deliver("chat", JOB)
        second = await store.record(reply("oui", "b"))
        third = await store.record(reply("non", "c"))
        assert first.message_id is not None
        assert second.message_id is not None
        await store.deliver("chat", JOB, after=first.message_id)
        await store.acknowledge("chat", JOB, second.message_id)

        listed = await store.messages("chat", JOB)

        assert [(m.message_id, m.state, m.deliveries) for m in listed] == [
            (first.message_id, ControlState.DELIVERED, 1),
            (second.message_id, ControlState.ACKNOWLEDGED, 1),
            (third.message_id, ControlState.DELIVERED, 1),
        ]

    async def test_a_wait_returns_when_a_message_is_recorded(self) -> None:
        store = await self.make_store()
        seen = await store.deliver("chat", JOB)
        waiting = asyncio.create_task(store.wait("chat", JOB, after=seen.last_id, timeout_s=30.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()

        await (await self.make_store()).record(cancel())

        async with asyncio.timeout(10):
            await waiting

    async def test_a_wait_returns_at_once_for_a_message_already_there(self) -> None:
        store = await self.make_store()
        await store.record(cancel())

        async with asyncio.timeout(10):
            await store.wait("chat", JOB, after="0-0", timeout_s=30.0)

    async def test_a_wait_ends_at_its_timeout(self) -> None:
        store = await self.make_store()

        async with asyncio.timeout(10):
            await store.wait("chat", JOB, after="0-0", timeout_s=0.05)
