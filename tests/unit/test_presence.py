"""Viewer counts: counted where job streams open and close (never per event), posted to the
board in changes, served on the metrics and read back for the console."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.metrics import InMemoryRouterMetrics
from eco_router.adapters.memory.presence_board import InMemoryPresenceBoard
from eco_router.adapters.prometheus.gateway_metrics import PrometheusGatewayMetrics
from eco_router.application.domains import UnknownDomain
from eco_router.application.errors import TransientError
from eco_router.application.periodic import run_every
from eco_router.application.presence import CountJobViewers, PostViewerCounts, ViewerTally
from eco_router.application.router_health import RouterHealth
from eco_router.application.stream_job_events import StreamJobEvents
from tests.unit.factories import FAMILY, eventually
from tests.unit.test_stream_job_events import Gateway

TTL_S = 15.0


async def counted_gateway() -> tuple[Gateway, ViewerTally]:
    """The stream use case of `test_stream_job_events`, counting its viewers in a tally."""
    gw = Gateway()
    await gw.h.source.prepare()
    tally = ViewerTally()
    gw.stream = StreamJobEvents(
        feed=gw.feed,
        store=gw.h.store,
        decoder=gw.decoder,
        clock=gw.h.clock,
        metrics=gw.metrics,
        limits=gw.limits,
        viewers=tally,
    )
    return gw, tally


def board(clock: ManualClock | None = None) -> InMemoryPresenceBoard:
    return InMemoryPresenceBoard(clock=clock or ManualClock(), ttl_s=TTL_S)


class TestCountingViewers:
    async def test_counts_go_up_as_streams_open_and_down_as_clients_disconnect(self) -> None:
        gw, tally = await counted_gateway()
        first, second = gw.connect("job-1"), gw.connect("job-1")
        other = gw.connect("job-2")
        await eventually(lambda: gw.metrics.active == 3)

        assert (tally.of("scan", "job-1"), tally.of("scan", "job-2")) == (2, 1)
        assert tally.by_domain() == {"scan": (3, 2)}

        await first.disconnect()
        await other.disconnect()

        assert (tally.of("scan", "job-1"), tally.of("scan", "job-2")) == (1, 0)
        assert tally.by_domain() == {"scan": (1, 1)}
        await second.disconnect()
        assert tally.counts() == {}

    async def test_a_stream_that_ends_on_done_is_no_longer_counted(self) -> None:
        gw, tally = await counted_gateway()
        viewer = gw.connect("job-1")
        await eventually(lambda: tally.of("scan", "job-1") == 1)

        await gw.produce("job-1", 1, stage="done", status="done")
        await viewer.ended()

        assert tally.counts() == {}
        assert tally.by_domain() == {"scan": (0, 0)}

    async def test_a_stream_that_cannot_open_is_never_counted(self) -> None:
        gw, tally = await counted_gateway()
        gw.h.store.available = False

        with pytest.raises(TransientError):
            await gw.stream.open("scan", "job-1")

        assert tally.counts() == {}
        assert tally.take_changes() == {}

    async def test_events_cost_no_board_write(self) -> None:
        gw, tally = await counted_gateway()
        shared = board()
        post = PostViewerCounts(tally=tally, board=shared, gateway="gw-a")
        viewer = await gw.connected("job-1")
        await post()
        posts = shared.posts

        await gw.produce("job-1", 1, 2, 3)
        await viewer.has_seen(3)

        # Nothing changed for the board: the next period's post only renews the counts.
        assert tally.take_changes() == {}
        assert shared.posts == posts
        await viewer.disconnect()


class TestPostingViewerCounts:
    async def test_the_first_post_is_whole_then_only_changed_jobs_are_posted(self) -> None:
        tally, shared = ViewerTally(), board()
        post = PostViewerCounts(tally=tally, board=shared, gateway="gw-a")
        tally.opened("scan", "job-1")
        tally.opened("scan", "job-2")
        await post()
        tally.closed("scan", "job-2")

        assert tally.take_changes() == {("scan", "job-2"): 0}
        tally.give_back({("scan", "job-2"): 0})
        await post()

        assert await shared.viewers("scan", "job-1") == {"gw-a": 1}
        assert await shared.viewers("scan", "job-2") == {}

    async def test_counts_that_lapsed_on_the_board_are_posted_whole_again(self) -> None:
        clock = ManualClock()
        tally, shared = ViewerTally(), board(clock)
        post = PostViewerCounts(tally=tally, board=shared, gateway="gw-a")
        tally.opened("scan", "job-1")
        await post()
        clock.advance(round(TTL_S * 1000) + 1)
        tally.opened("scan", "job-2")

        await post()

        assert await shared.viewers("scan", "job-1") == {"gw-a": 1}
        assert await shared.viewers("scan", "job-2") == {"gw-a": 1}

    async def test_changes_of_a_failed_post_go_in_the_next_one(self) -> None:
        tally, shared = ViewerTally(), board()
        post = PostViewerCounts(tally=tally, board=shared, gateway="gw-a")
        await post()
        tally.opened("scan", "job-1")
        shared.available = False

        with pytest.raises(TransientError):
            await post()
        shared.available = True
        await post()

        assert await shared.viewers("scan", "job-1") == {"gw-a": 1}

    async def test_a_change_is_posted_soon_not_a_period_later(self) -> None:
        tally, shared, stop = ViewerTally(), board(), asyncio.Event()
        post = PostViewerCounts(tally=tally, board=shared, gateway="gw-a")
        health = RouterHealth(clock=ManualClock(), metrics=InMemoryRouterMetrics(), idle_check=None)
        loop = asyncio.create_task(
            run_every(
                3600,
                stop,
                post,
                name="presence",
                health=health,
                soon=tally.changed,
                soon_after_s=0.05,
            )
        )
        try:
            await eventually(lambda: shared.posts == 1)
            tally.opened("scan", "job-1")
            tally.opened("scan", "job-1")

            await eventually(lambda: shared.posts == 2)

            # Both opened within the batching time: one post carried them.
            assert await shared.viewers("scan", "job-1") == {"gw-a": 2}
        finally:
            stop.set()
            await loop


class TestViewerGauges:
    def test_viewers_and_jobs_watched_by_domain_are_read_when_scraped(self) -> None:
        registry, tally = CollectorRegistry(), ViewerTally()
        PrometheusGatewayMetrics(registry, viewers=tally)
        for job in ("job-1", "job-1", "job-2"):
            tally.opened("scan", job)
        tally.opened("chat", "job-3")
        tally.closed("chat", "job-3")

        def sample(name: str, domain: str) -> float | None:
            return registry.get_sample_value(name, {"domain": domain})

        assert sample("event_router_gateway_viewers", "scan") == 3
        assert sample("event_router_gateway_jobs_watched", "scan") == 2
        assert sample("event_router_gateway_viewers", "chat") == 0
        assert sample("event_router_gateway_jobs_watched", "chat") == 0


class TestCountingAJobsViewers:
    async def test_the_total_is_the_sum_over_the_gateways(self) -> None:
        shared = board()
        await shared.post("gw-b", {("scan", "job-1"): 1}, whole=True)
        await shared.post("gw-a", {("scan", "job-1"): 3}, whole=True)

        viewers = await CountJobViewers(board=shared, families=(FAMILY,))("scan", "job-1")

        assert viewers.by_gateway == {"gw-a": 3, "gw-b": 1}
        assert viewers.total == 4

    async def test_an_unknown_domain_or_a_malformed_job_id_is_refused(self) -> None:
        count = CountJobViewers(board=board(), families=(FAMILY,))

        with pytest.raises(UnknownDomain):
            await count("nowhere", "job-1")
        with pytest.raises(ValueError, match="job_id"):
            await count("scan", "no spaces")
