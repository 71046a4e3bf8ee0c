"""ViewerQueue: a viewer's bounded live queue, dropping the oldest events, never the end."""

from __future__ import annotations

import asyncio
from typing import Any

from eco_router.adapters.feed_queue import ViewerQueue
from eco_router.application.port_values import FeedClosed, FeedGap, LiveEvent
from eco_router.domain.sse import GatewayEvent


def running(seq: int) -> GatewayEvent:
    return GatewayEvent(event_id=seq, stage="scan", status="running", data=b'{"seq":%d}' % seq)


def done(seq: int) -> GatewayEvent:
    return GatewayEvent(event_id=seq, stage="done", status="done", data=b'{"seq":%d}' % seq)


class DropCounter:
    """Records what the queue reports through `on_drop`."""

    def __init__(self) -> None:
        self.reports: list[int] = []

    def __call__(self, count: int) -> None:
        self.reports.append(count)

    @property
    def total(self) -> int:
        return sum(self.reports)


async def drain(queue: ViewerQueue) -> list[GatewayEvent | FeedGap]:
    """Everything the queue holds now, in the order a viewer reads it."""
    items: list[GatewayEvent | FeedGap] = []
    while (item := await queue.get(0)) is not None:
        items.append(item)
    return items


class TestWithinCapacity:
    async def test_events_come_out_in_the_order_they_were_put(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=3, on_drop=drops)
        for seq in (1, 2, 3):
            queue.put(running(seq))

        assert await drain(queue) == [running(1), running(2), running(3)]
        assert drops.reports == []

    async def test_an_empty_queue_gives_none_when_the_wait_ends(self) -> None:
        queue = ViewerQueue(maxsize=3)

        assert await queue.get(0) is None

    async def test_a_waiting_viewer_gets_an_event_put_while_it_waits(self) -> None:
        queue = ViewerQueue(maxsize=3)
        waiting = asyncio.create_task(queue.get(30))
        await asyncio.sleep(0)
        assert not waiting.done()

        queue.put(running(1))

        async with asyncio.timeout(5):
            assert await waiting == running(1)


class TestOverflow:
    async def test_a_full_queue_drops_its_oldest_event_and_reports_a_gap_first(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=2, on_drop=drops)
        for seq in (1, 2, 3):
            queue.put(running(seq))

        assert await drain(queue) == [FeedGap("slow_client"), running(2), running(3)]
        assert drops.total == 1

    async def test_every_overflow_is_reported_but_one_gap_covers_them(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=2, on_drop=drops)
        for seq in range(1, 8):
            queue.put(running(seq))

        items = await drain(queue)

        assert items == [FeedGap("slow_client"), running(6), running(7)]
        assert drops.reports == [1, 1, 1, 1, 1]

    async def test_the_terminal_event_is_kept_when_the_queue_overflows(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=2, on_drop=drops)
        for seq in (1, 2):
            queue.put(running(seq))
        queue.put(done(3))

        assert await drain(queue) == [FeedGap("slow_client"), running(2), done(3)]
        assert drops.total == 1

    async def test_a_queued_terminal_event_stays_last_through_a_later_overflow(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=2, on_drop=drops)
        queue.put(running(1))
        queue.put(done(2))
        queue.put(running(3))

        assert await drain(queue) == [FeedGap("slow_client"), running(3), done(2)]
        assert drops.total == 1

    async def test_a_later_terminal_event_replaces_the_queued_one(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=3, on_drop=drops)
        queue.put(running(1))
        queue.put(done(2))
        queue.put(done(3))

        assert await drain(queue) == [FeedGap("slow_client"), running(1), done(3)]
        assert drops.total == 1

    async def test_a_flood_of_terminal_events_keeps_the_queue_at_its_bound(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=4, on_drop=drops)
        queue.put(running(1))
        for seq in range(2, 10_002):
            queue.put(done(seq))

        assert len(queue) == 2
        assert await drain(queue) == [FeedGap("slow_client"), running(1), done(10_001)]
        assert drops.total == 9_999

    async def test_a_queue_of_one_holding_the_end_drops_a_new_intermediate_event(self) -> None:
        drops = DropCounter()
        queue = ViewerQueue(maxsize=1, on_drop=drops)
        queue.put(done(1))
        queue.put(running(2))

        assert await drain(queue) == [FeedGap("slow_client"), done(1)]
        assert drops.total == 1

    async def test_an_overflow_without_a_drop_callback_still_reports_the_gap(self) -> None:
        queue = ViewerQueue(maxsize=1)
        queue.put(running(1))
        queue.put(running(2))

        assert await drain(queue) == [FeedGap("slow_client"), running(2)]

    async def test_a_waiting_viewer_is_woken_by_the_gap(self) -> None:
        queue = ViewerQueue(maxsize=3)
        waiting = asyncio.create_task(queue.get(30))
        await asyncio.sleep(0)

        queue.mark_gap("reconnect")

        async with asyncio.timeout(5):
            assert await waiting == FeedGap("reconnect")


class TestMarkedGaps:
    async def test_a_marked_gap_is_read_before_the_queued_events_and_only_once(self) -> None:
        queue = ViewerQueue(maxsize=5)
        queue.put(running(1))
        queue.mark_gap("reconnect")
        queue.put(running(2))

        assert await drain(queue) == [FeedGap("reconnect"), running(1), running(2)]

    async def test_a_marked_gap_on_an_empty_queue_is_read_without_waiting(self) -> None:
        queue = ViewerQueue(maxsize=5)
        queue.mark_gap("reconnect")

        assert await queue.get(0) == FeedGap("reconnect")
        assert await queue.get(0) is None


class TestClosing:
    async def test_events_queued_before_the_close_are_read_first_then_closed_for_good(
        self,
    ) -> None:
        queue = ViewerQueue(maxsize=5)
        queue.put(running(1))
        queue.put(done(2))

        queue.close()

        assert [await queue.get(0) for _ in range(4)] == [
            running(1),
            done(2),
            FeedClosed(),
            FeedClosed(),
        ]

    async def test_a_waiting_viewer_is_woken_by_the_close(self) -> None:
        queue = ViewerQueue(maxsize=3)
        waiting = asyncio.create_task(queue.get(30))
        await asyncio.sleep(0)

        queue.close()

        async with asyncio.timeout(5):
            assert await waiting == FeedClosed()


async def waiting_with_a_handler() -> tuple[ViewerQueue, list[GatewayEvent], asyncio.Task[Any]]:
    """A queue whose viewer waits, with a write-through handler that takes every event it is
    offered; the events it took."""
    written: list[GatewayEvent] = []
    queue = ViewerQueue(maxsize=3)
    queue.write_through = lambda live: written.append(live.event) is None
    waiting = asyncio.create_task(queue.get(30))
    await asyncio.sleep(0)
    return queue, written, waiting


class TestWritingThrough:
    async def test_an_event_for_a_waiting_viewer_goes_to_the_handler_not_the_queue(self) -> None:
        queue, written, waiting = await waiting_with_a_handler()

        queue.offer(LiveEvent(running(1)))

        assert written == [running(1)]
        assert len(queue) == 0
        assert not waiting.done()
        waiting.cancel()

    async def test_a_viewer_woken_but_not_yet_running_gets_later_events_queued_behind(
        self,
    ) -> None:
        queue, written, waiting = await waiting_with_a_handler()

        queue.mark_gap("pubsub_reconnect")
        queue.offer(LiveEvent(running(1)))

        assert written == []
        async with asyncio.timeout(5):
            assert await waiting == FeedGap("pubsub_reconnect")
        assert await drain(queue) == [running(1)]

    async def test_a_viewer_that_stopped_waiting_gets_its_events_queued(self) -> None:
        queue, written, waiting = await waiting_with_a_handler()
        waiting.cancel()
        await asyncio.wait([waiting])

        queue.offer(LiveEvent(running(1)))

        assert written == []
        assert await drain(queue) == [running(1)]

    async def test_a_queue_emptied_and_filled_again_keeps_the_order(self) -> None:
        queue = ViewerQueue(maxsize=3)
        queue.put(running(1))
        assert await drain(queue) == [running(1)]

        for seq in (2, 3):
            queue.put(running(seq))
        queue.put(done(4))

        assert await drain(queue) == [running(2), running(3), done(4)]
