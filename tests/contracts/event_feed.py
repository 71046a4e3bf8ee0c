"""The `EventFeed` contract: a viewer's live events of one job, in order, until it leaves."""

from __future__ import annotations

from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.application.port_values import EncodedEvent, FeedClosed, FeedGap
from eco_router.application.ports import Broadcaster, EventFeed, FeedSubscription, GatewayMetrics
from eco_router.domain.sse import GatewayEvent
from tests.contracts.factories import ContractFamilies, entry_id, wait_until

PREFIX = "progress"
WAIT_S = 5.0


class EventFeedContract(ContractFamilies):
    """Every `EventFeed` adapter, fed by a `Broadcaster` on channels `{PREFIX}:{job_id}`.

    Subclasses wire a backend and implement the hook below.
    """

    async def make_feed(
        self, *, metrics: GatewayMetrics, queue_size: int = 256
    ) -> tuple[EventFeed, Broadcaster]:
        """A running feed (decoding with `OrjsonEventDecoder`, reporting to `metrics`) and a
        broadcaster that publishes to it, both with prefix `PREFIX`."""
        raise NotImplementedError

    async def feed(self, queue_size: int = 256) -> tuple[EventFeed, Broadcaster]:
        self.metrics = InMemoryGatewayMetrics()
        return await self.make_feed(metrics=self.metrics, queue_size=queue_size)

    async def test_a_viewer_gets_its_jobs_events_in_publish_order(self) -> None:
        feed, broadcaster = await self.feed()
        viewer = await feed.subscribe("scan", "job-1")
        events = [self.encoded(job_id="job-1", seq=n, stream_id=entry_id(n)) for n in (1, 2, 3)]

        await broadcaster.broadcast(events)

        assert await seqs(viewer, 3) == [1, 2, 3]
        await viewer.close()

    async def test_events_of_other_jobs_and_other_domains_are_not_delivered(self) -> None:
        feed, broadcaster = await self.feed()
        viewer = await feed.subscribe("scan", "job-1")
        other_job = self.encoded(job_id="job-2", seq=1, stream_id=entry_id(1))
        other_domain = self.encoded(job_id="job-1", seq=2, domain="chat", stream_id=entry_id(2))
        mine = self.encoded(job_id="job-1", seq=3, stream_id=entry_id(3))

        await broadcaster.broadcast([other_job, other_domain, mine])

        assert await seqs(viewer, 1) == [3]
        assert await viewer.next(0.2) is None
        await viewer.close()

    async def test_a_payload_that_is_not_a_routed_event_is_ignored(self) -> None:
        feed, broadcaster = await self.feed()
        viewer = await feed.subscribe("scan", "job-1")
        garbage = EncodedEvent(self.encoded(job_id="job-1").event, b"not json")
        good = self.encoded(job_id="job-1", seq=7, stream_id=entry_id(7))

        await broadcaster.broadcast([garbage, good])

        assert await seqs(viewer, 1) == [7]
        await viewer.close()

    async def test_viewers_of_one_job_each_get_every_event_and_one_leaving_spares_the_other(
        self,
    ) -> None:
        feed, broadcaster = await self.feed()
        first = await feed.subscribe("scan", "job-1")
        second = await feed.subscribe("scan", "job-1")
        await broadcaster.broadcast([self.encoded(job_id="job-1", seq=1, stream_id=entry_id(1))])
        assert await seqs(first, 1) == [1]
        assert await seqs(second, 1) == [1]

        await first.close()
        await broadcaster.broadcast([self.encoded(job_id="job-1", seq=2, stream_id=entry_id(2))])

        assert await seqs(second, 1) == [2]
        await second.close()

    async def test_nothing_published_means_none_when_the_wait_ends(self) -> None:
        feed, _ = await self.feed()
        viewer = await feed.subscribe("scan", "job-1")

        assert await viewer.next(0.05) is None
        await viewer.close()

    async def test_a_viewer_that_falls_behind_gets_a_gap_then_what_was_kept(self) -> None:
        feed, broadcaster = await self.feed(queue_size=2)
        viewer = await feed.subscribe("scan", "job-1")
        events = [self.encoded(job_id="job-1", seq=n, stream_id=entry_id(n)) for n in range(1, 6)]

        await broadcaster.broadcast(events)

        async def overflowed() -> bool:
            return self.metrics.dropped >= 3

        await wait_until(overflowed, what="the overflow")

        assert await next_item(viewer) == FeedGap("slow_client")
        assert await seqs(viewer, 2) == [4, 5]  # each overflow drops the oldest
        assert await viewer.next(0.1) is None
        await viewer.close()

    async def test_closing_the_feed_ends_open_and_later_subscriptions(self) -> None:
        feed, broadcaster = await self.feed()
        open_viewer = await feed.subscribe("scan", "job-1")
        await broadcaster.broadcast([self.encoded(job_id="job-1", seq=1, stream_id=entry_id(1))])
        assert await seqs(open_viewer, 1) == [1]

        feed.close_viewers()
        later = await feed.subscribe("scan", "job-2")

        assert await next_item(open_viewer) == FeedClosed()
        assert await next_item(later) == FeedClosed()
        await open_viewer.close()
        await later.close()


async def next_item(viewer: FeedSubscription) -> GatewayEvent | FeedGap | FeedClosed:
    item = await viewer.next(WAIT_S)
    assert item is not None, f"nothing within {WAIT_S} s"
    return item


async def seqs(viewer: FeedSubscription, count: int) -> list[int]:
    """The seqs of the next `count` items, which must all be events."""
    got = []
    for _ in range(count):
        item = await next_item(viewer)
        assert isinstance(item, GatewayEvent), item
        got.append(item.event_id)
    return got
