"""The `ControlStore` contract, with the rules of `SendControl` on top: recording (once per
sender's request id, refused for a job without events or that ended, bounded), the
announcement in the job's shard stream, delivery until acknowledged, and waiting."""

from __future__ import annotations

import asyncio
import json
from typing import ClassVar

import pytest

from eco_router.adapters.memory.clock import ManualClock
from eco_router.application.errors import (
    ControlExhausted,
    ControlLimited,
    JobEnded,
    RequestIdConflict,
    UnknownJob,
)
from eco_router.application.ports import ControlStore, StateStore
from eco_router.application.send_control import SendControl
from eco_router.domain.control import (
    Admission,
    ControlKind,
    ControlLimits,
    ControlReceipt,
    ControlRequest,
    ControlState,
    Recorded,
    admit,
    control_request,
    lifecycle_fields,
)
from tests.contracts.factories import ContractFamilies, encoded

JOB = "job-1"


def cancel(request_id: str = "r-1", job_id: str = JOB, sender: str = "alice") -> ControlRequest:
    return control_request(
        "chat", job_id, ControlKind.CANCEL, b'{"reason":"stop"}', request_id, sender=sender
    )


def reply(text: str, request_id: str, job_id: str = JOB, sender: str = "alice") -> ControlRequest:
    body = json.dumps({"input": text}).encode()
    return control_request("chat", job_id, ControlKind.INPUT, body, request_id, sender=sender)


async def record(store: ControlStore, request: ControlRequest) -> str:
    """Write `request` as the next message whatever the rules say (for tests of the worker's
    side, on a job no router started): its message id."""
    seen = await store.control_log(request)
    message_id = await store.append(request, Admission(number=seen.count + 1), version=seen.version)
    assert message_id is not None
    return message_id


class ControlStoreContract(ContractFamilies):
    """Every `ControlStore` adapter, on the class's families (chat job-1 on `chat_0`)."""

    limits: ClassVar[ControlLimits] = ControlLimits()

    async def make_store(self) -> ControlStore:
        raise NotImplementedError

    # The backend's state store, where a router applies the job's events (fenced at epoch 1).
    states: StateStore

    async def start_job(self, job_id: str) -> None:
        """Apply the job's first event to the backend's state, as a router does."""
        await self._apply(job_id, seq=10, stage="queued", status="queued")

    async def started(self, *job_ids: str) -> ControlStore:
        """A store, with `JOB` (and `job_ids`) started."""
        for job_id in (JOB, *job_ids):
            await self.start_job(job_id)
        return await self.make_store()

    async def send(
        self, store: ControlStore, request: ControlRequest, *, limits: ControlLimits | None = None
    ) -> ControlReceipt:
        """Record `request` as the gateway does: `SendControl`'s rules on this store."""
        if not hasattr(self, "rules_clock"):
            self.rules_clock = ManualClock()
        rules = SendControl(store=store, clock=self.rules_clock, limits=limits or self.limits)
        return await rules(request)

    async def end_job(self, job_id: str, *, stage: str = "done", status: str = "done") -> None:
        """Apply the job's terminal event to the backend's state, as a router does."""
        await self._apply(job_id, seq=181, stage=stage, status=status)

    async def _apply(self, job_id: str, *, seq: int, stage: str, status: str) -> None:
        event = encoded(
            domain="chat", stream=self.chat_0, job_id=job_id, seq=seq, stage=stage, status=status
        )
        await self.states.apply([event], {self.chat_0: 1})

    async def shard_entries(self, stream: str) -> list[dict[str, str]]:
        """The fields of every entry of `stream`, in order."""
        raise NotImplementedError

    async def control_keys(self, job_id: str) -> int:
        """How many of the chat job's control keys the backend holds."""
        raise NotImplementedError

    async def test_a_new_request_is_recorded_with_the_next_number(self) -> None:
        store = await self.started()
        first = await self.send(store, cancel("a"))
        second = await self.send(store, reply("oui", "b"))

        assert (first.outcome, first.number, first.kind) == (Recorded.NEW, 1, ControlKind.CANCEL)
        assert (second.outcome, second.number, second.kind) == (Recorded.NEW, 2, ControlKind.INPUT)
        assert first.message_id is not None
        assert first.message_id != second.message_id

    async def test_a_request_id_again_answers_the_first_receipt_and_adds_nothing(self) -> None:
        store = await self.started()
        first = await self.send(store, reply("oui", "a"))
        again = await self.send(store, reply("non", "a"))

        assert again.outcome is Recorded.DUPLICATE
        assert (again.message_id, again.number, again.kind) == (
            first.message_id,
            first.number,
            first.kind,
        )
        assert (await store.messages("chat", JOB)).total == 1
        assert len(await self.shard_entries(self.chat_0)) == 1

    async def test_request_ids_belong_to_their_sender(self) -> None:
        store = await self.started()
        theirs = await self.send(store, reply("hijack", "stop-J", sender="bob"))
        mine = await self.send(store, cancel("stop-J", sender="alice"))

        assert (theirs.outcome, mine.outcome) == (Recorded.NEW, Recorded.NEW)
        assert mine.kind is ControlKind.CANCEL
        assert await store.cancelled("chat", JOB)

    async def test_a_request_id_used_for_the_other_kind_is_refused(self) -> None:
        store = await self.started()
        await self.send(store, reply("oui", "a"))

        with pytest.raises(RequestIdConflict, match="was used for input, not cancel"):
            await self.send(store, cancel("a"))
        assert not await store.cancelled("chat", JOB)

    async def test_a_job_without_any_event_is_refused_and_nothing_is_written(self) -> None:
        store = await self.make_store()

        with pytest.raises(UnknownJob):
            await self.send(store, reply("oui", "a", job_id="job-unknown"))

        assert (await store.messages("chat", "job-unknown")).total == 0
        assert await self.shard_entries(self.chat_0) == []
        assert await self.control_keys("job-unknown") == 0

    async def test_a_request_for_a_job_that_ended_is_refused_and_writes_nothing(self) -> None:
        store = await self.started()
        await self.end_job(JOB)

        with pytest.raises(JobEnded):
            await self.send(store, cancel())

        assert (await store.messages("chat", JOB)).total == 0
        assert not await store.cancelled("chat", JOB)

    async def test_a_failed_job_has_ended_too(self) -> None:
        store = await self.started()
        await self.end_job(JOB, stage="answer", status="failed")

        with pytest.raises(JobEnded):
            await self.send(store, cancel())

    async def test_a_request_id_recorded_before_the_end_still_answers_its_receipt(self) -> None:
        store = await self.started()
        first = await self.send(store, cancel())
        await self.end_job(JOB)

        again = await self.send(store, cancel())

        assert (again.outcome, again.message_id) == (Recorded.DUPLICATE, first.message_id)

    async def test_a_second_cancel_answers_the_first(self) -> None:
        store = await self.started()
        first = await self.send(store, cancel("a"))
        second = await self.send(store, cancel("b", sender="bob"))

        assert second.outcome is Recorded.CANCELLED_BEFORE
        assert (second.message_id, second.number) == (first.message_id, first.number)
        assert (await store.messages("chat", JOB)).total == 1

    async def test_inputs_past_the_waiting_bound_wait_for_the_worker_and_a_cancel_passes(
        self,
    ) -> None:
        store = await self.started()
        limits = ControlLimits(max_waiting=2, burst=100)
        first = await self.send(store, reply("1", "a"), limits=limits)
        await self.send(store, reply("2", "b"), limits=limits)

        with pytest.raises(ControlLimited) as refused:
            await self.send(store, reply("3", "c"), limits=limits)
        assert refused.value.retry_after_s == 1
        stop = await self.send(store, cancel("x"), limits=limits)
        assert stop.outcome is Recorded.NEW

        for handled in (first, stop):
            assert handled.message_id is not None
            assert await store.acknowledge("chat", JOB, handled.message_id)
        assert (await self.send(store, reply("3", "c"), limits=limits)).outcome is Recorded.NEW

    async def test_bytes_waiting_are_bounded_too(self) -> None:
        store = await self.started()
        limits = ControlLimits(max_waiting_bytes=4096, burst=100)
        await self.send(store, reply("x" * 3000, "a"), limits=limits)

        with pytest.raises(ControlLimited, match="bytes wait for the job's worker"):
            await self.send(store, reply("y" * 2000, "b"), limits=limits)

    async def test_a_job_takes_so_many_messages_in_its_lifetime_and_a_cancel_after(
        self,
    ) -> None:
        store = await self.started()
        limits = ControlLimits(max_messages=2, burst=100)
        for n in range(2):
            receipt = await self.send(store, reply(str(n), f"r{n}"), limits=limits)
            assert receipt.message_id is not None
            await store.acknowledge("chat", JOB, receipt.message_id)

        with pytest.raises(ControlExhausted, match="has had 2 control messages"):
            await self.send(store, reply("more", "r9"), limits=limits)
        assert (await self.send(store, cancel("x"), limits=limits)).outcome is Recorded.NEW

    async def test_a_sender_past_its_rate_is_told_when_to_retry(self) -> None:
        store = await self.started()
        limits = ControlLimits(rate_per_s=0.5, burst=2)
        await self.send(store, reply("1", "a"), limits=limits)
        await self.send(store, reply("2", "b"), limits=limits)

        with pytest.raises(ControlLimited) as refused:
            await self.send(store, reply("3", "c"), limits=limits)
        assert refused.value.retry_after_s == 2
        other = await self.send(store, reply("3", "c", sender="bob"), limits=limits)
        assert other.outcome is Recorded.NEW
        self.rules_clock.advance(2000)
        assert (await self.send(store, reply("3", "c"), limits=limits)).outcome is Recorded.NEW

    async def test_a_write_after_the_log_moved_writes_nothing(self) -> None:
        store = await self.started()
        request = reply("oui", "a")
        seen = await store.control_log(request)
        await self.send(store, reply("other", "b"))

        admission = admit(request, seen, self.limits, 0)
        assert await store.append(request, admission, version=seen.version) is None

        assert (await store.messages("chat", JOB)).total == 1

    async def test_a_write_after_the_job_ended_writes_nothing(self) -> None:
        store = await self.started()
        request = cancel()
        seen = await store.control_log(request)
        await self.end_job(JOB)

        admission = admit(request, seen, self.limits, 0)
        assert await store.append(request, admission, version=seen.version) is None

        assert not await store.cancelled("chat", JOB)

    async def test_the_log_read_tells_what_the_rules_need(self) -> None:
        store = await self.started()
        first = await self.send(store, reply("oui", "a"))
        await self.send(store, cancel("b"))

        seen = await store.control_log(reply("again", "a"))

        assert (seen.known, seen.ended, seen.count, seen.waiting) == (True, False, 2, 2)
        assert seen.waiting_bytes == len(b'{"input":"oui"}') + len(b'{"reason":"stop"}')
        assert seen.first is not None
        assert (seen.first.message_id, seen.first.number) == (first.message_id, 1)
        assert seen.cancel is not None
        assert seen.cancel.number == 2
        assert seen.bucket is not None

    async def test_the_announcement_joins_the_jobs_shard_stream(self) -> None:
        store = await self.started()
        request = reply("oui", "a")
        receipt = await self.send(store, request)
        assert receipt.message_id is not None

        (entry,) = [e for e in await self.shard_entries(self.chat_0) if "control_id" in e]

        expected = lifecycle_fields(request, receipt.message_id, 1, entry["ts"])
        assert entry == expected
        assert entry["stage"] == "input_received"

    async def test_a_worker_is_handed_every_unacknowledged_message_again(self) -> None:
        store = await self.started()
        first = await self.send(store, cancel("a"))
        second = await self.send(store, reply("oui", "b"))
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
        store = await self.started()
        first = await self.send(store, cancel("a"))
        second = await self.send(store, reply("oui", "b"))
        assert first.message_id is not None

        later = await store.deliver("chat", JOB, after=first.message_id)

        assert [m.message_id for m in later.messages] == [second.message_id]

    async def test_nothing_is_handed_once_the_job_has_ended(self) -> None:
        store = await self.started()
        await self.send(store, cancel())
        await self.end_job(JOB, status="cancelled")

        handed = await store.deliver("chat", JOB)

        assert handed.ended
        assert handed.messages == ()

    async def test_an_unknown_job_has_nothing_pending(self) -> None:
        store = await self.started()

        handed = await store.deliver("chat", "job-x")

        assert (handed.messages, handed.last_id, handed.ended) == ((), "0-0", False)

    async def test_acknowledging_an_unknown_message_is_false(self) -> None:
        store = await self.started()

        assert not await store.acknowledge("chat", JOB, "1-0")

    async def test_a_cancel_is_known_at_once_and_an_input_is_no_cancel(self) -> None:
        store = await self.started()
        await self.send(store, reply("oui", "a"))
        assert not await store.cancelled("chat", JOB)

        await self.send(store, cancel("b"))

        assert await store.cancelled("chat", JOB)
        assert not await store.cancelled("chat", "job-2")

    async def test_messages_show_each_state(self) -> None:
        store = await self.started()
        first = await self.send(store, cancel("a"))
        await store.deliver("chat", JOB)
        second = await self.send(store, reply("oui", "b"))
        third = await self.send(store, reply("non", "c"))
        assert first.message_id is not None
        assert second.message_id is not None
        await store.deliver("chat", JOB, after=first.message_id)
        await store.acknowledge("chat", JOB, second.message_id)

        listed = (await store.messages("chat", JOB)).messages

        assert [(m.message_id, m.state, m.deliveries) for m in listed] == [
            (first.message_id, ControlState.DELIVERED, 1),
            (second.message_id, ControlState.ACKNOWLEDGED, 1),
            (third.message_id, ControlState.DELIVERED, 1),
        ]

    async def test_acknowledged_messages_leave_the_log_and_cost_no_read(self) -> None:
        store = await self.started()
        limits = ControlLimits(max_waiting=1000, burst=1000)
        for n in range(150):
            receipt = await self.send(store, reply(str(n), f"r{n}"), limits=limits)
            assert receipt.message_id is not None
            assert await store.acknowledge("chat", JOB, receipt.message_id)
        late = await self.send(store, cancel("stop"), limits=limits)

        handed = await store.deliver("chat", JOB)

        assert [m.message_id for m in handed.messages] == [late.message_id]
        assert not handed.more
        assert (await store.control_log(cancel("other"))).waiting == 1

    async def test_a_full_page_says_more_follow(self) -> None:
        store = await self.started()
        limits = ControlLimits(burst=100)
        for n in range(3):
            await self.send(store, reply(str(n), f"r{n}"), limits=limits)

        page = await store.deliver("chat", JOB, limit=2)
        rest = await store.deliver("chat", JOB, after=page.last_id, limit=2)

        assert (len(page.messages), page.more) == (2, True)
        assert (len(rest.messages), rest.more) == (1, False)

    async def test_acknowledging_twice_frees_one_place(self) -> None:
        store = await self.started()
        first = await self.send(store, reply("a", "a"))
        await self.send(store, reply("b", "b"))
        assert first.message_id is not None

        assert await store.acknowledge("chat", JOB, first.message_id)
        assert await store.acknowledge("chat", JOB, first.message_id)

        seen = await store.control_log(reply("c", "c"))
        assert (seen.waiting, seen.waiting_bytes) == (1, len(b'{"input":"b"}'))

    async def test_the_console_page_is_bounded_and_keeps_no_acknowledged_body(self) -> None:
        store = await self.started()
        limits = ControlLimits(burst=100)
        receipts = [
            await self.send(store, reply("x" * 1000, f"r{n}"), limits=limits) for n in range(5)
        ]
        assert receipts[3].message_id is not None
        await store.acknowledge("chat", JOB, receipts[3].message_id)

        page = await store.messages("chat", JOB, limit=2)

        assert (page.total, page.waiting) == (5, 4)
        assert [m.number for m in page.messages] == [4, 5]
        acknowledged, waiting = page.messages
        assert (acknowledged.state, acknowledged.preview) == (ControlState.ACKNOWLEDGED, None)
        assert acknowledged.size == len(b'{"input":""}') + 1000
        assert waiting.preview is not None
        assert waiting.preview.startswith('{"input":"xxx')
        assert len(waiting.preview) == 200

    async def test_a_wait_returns_when_a_message_is_recorded(self) -> None:
        store = await self.started()
        seen = await store.deliver("chat", JOB)
        waiting = asyncio.create_task(store.wait("chat", JOB, after=seen.last_id, timeout_s=30.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()

        await self.send(await self.make_store(), cancel())

        async with asyncio.timeout(10):
            await waiting

    async def test_a_wait_returns_at_once_for_a_message_already_there(self) -> None:
        store = await self.started()
        await self.send(store, cancel())

        async with asyncio.timeout(10):
            await store.wait("chat", JOB, after="0-0", timeout_s=30.0)

    async def test_a_wait_ends_at_its_timeout(self) -> None:
        store = await self.started()

        async with asyncio.timeout(10):
            await store.wait("chat", JOB, after="0-0", timeout_s=0.05)
