"""Shard take-over end to end: real `eco-router worker` processes on the documented defaults.

Workers are killed, paused past their lease, scaled down and up and restarted one by one
while jobs keep writing; every scenario ends with the same checks (`settle_and_check`): each
job published exactly as written and in order, nothing pending, no stale verdict, clean exits.
Timings are printed as figures (`pytest -rP` shows them) and asserted only with a wide margin.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from eco_router.entrypoints.settings import Settings
from eco_router.testing import RedisServer
from tests.integration.support import CHANNEL_PREFIX, GROUP, SCAN, eventually
from tests.integration.takeover_support import (
    DefaultWorkers,
    Moment,
    PacedLoad,
    TimedCollector,
    busiest_first,
    fill_backlog,
    held_by,
    lease_owners,
    leases_spread,
    pause_while_holding,
    resume,
    settle_and_check,
    stale_count,
)

Figures = Callable[[str, float], None]

LANES = 60  # jobs side by side: about 480 events a second at 50-200 ms a step
# A dead holder's shards lapse after the lease TTL (4 s by default); this bound only catches
# a take-over that does not happen at all or waits for something else (the reclaimer: 5 min).
TAKEOVER_BOUND_S = 8.0


@pytest.fixture
def workers(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> Iterator[DefaultWorkers]:
    """Workers on the documented defaults (this replaces the shared `workers` fixture here)."""
    launcher = DefaultWorkers(
        tmp_path, streams_url=streams_server.url, pubsub_url=pubsub_server.url
    )
    yield launcher
    launcher.kill_all()


@pytest.fixture
async def collector(pubsub_server: RedisServer) -> AsyncIterator[TimedCollector]:
    async with TimedCollector(pubsub_server.url) as timed:
        yield timed


@pytest.fixture
def figures(
    request: pytest.FixtureRequest, record_property: Callable[[str, object], None]
) -> Figures:
    """Print a measured figure and keep it as a property of the test's report."""

    def record(name: str, value: float) -> None:
        print(f"{request.node.name}: {name} = {value:.3f}")
        record_property(name, value)

    return record


def test_the_documented_defaults_are_the_streams_group_and_channels_the_checks_read() -> None:
    fields = Settings.model_fields
    assert fields["streams"].default[0] == SCAN
    assert fields["consumer_group"].default == GROUP
    assert fields["channel_prefix"].default == CHANNEL_PREFIX
    assert (fields["lease_ttl_ms"].default, fields["lease_renew_ms"].default) == (4000, 1000)


class TestAWorkerKilledWhileHoldingEntries:
    async def test_its_entries_are_published_within_seconds_and_every_job_stays_in_order(
        self,
        workers: DefaultWorkers,
        collector: TimedCollector,
        streams_server: RedisServer,
        streams_redis: Redis,
        figures: Figures,
    ) -> None:
        victim, survivor = await workers.start(2)
        await eventually(lambda: leases_spread(streams_redis, [victim, survivor]), what="2 + 2")
        async with PacedLoad(streams_server.url, lanes=LANES, stem="kill", seed=1) as load:
            await load.run_for(2.0)
            stale_seen = await stale_count(victim)
            held, pauses = await pause_while_holding(
                victim, streams_redis, collector, random.Random(1), Moment.UNPUBLISHED
            )
            victim.kill()
            killed_at = time.monotonic()

            await eventually(
                lambda: held_by(streams_redis, survivor.name, SCAN.shards),
                timeout_s=TAKEOVER_BOUND_S,
                what="the survivor holding every shard",
            )
            await eventually(
                lambda: collector.published(held),
                timeout_s=TAKEOVER_BOUND_S,
                what="the killed worker's entries published",
            )
            published_s = collector.last_arrival(held) - killed_at
            await load.run_for(2.0)
            await load.stop()

        ending = await settle_and_check(
            written=load.written,
            collector=collector,
            streams_redis=streams_redis,
            workers=workers,
            stale_seen=stale_seen,
        )
        assert victim.exit_code == -9
        figures("entries held at the kill", len(held))
        figures("pauses until it held unpublished entries", pauses)
        figures("kill to its entries published (s)", published_s)
        figures("events", ending.events)
        figures("jobs", ending.jobs)
        assert published_s < TAKEOVER_BOUND_S


class TestABacklogDrainedByTwoWorkersOneKilled:
    async def test_every_event_is_published_exactly_once_in_order(
        self,
        workers: DefaultWorkers,
        collector: TimedCollector,
        streams_redis: Redis,
        figures: Figures,
    ) -> None:
        filling = time.monotonic()
        written = await fill_backlog(streams_redis, jobs=6_000, stem="backlog")
        fill_s = time.monotonic() - filling
        total = sum(len(seqs) for seqs in written.values())
        assert total >= 50_000

        started = time.monotonic()
        victim, survivor = await busiest_first(streams_redis, await workers.start(2))
        stale_seen = await stale_count(victim)
        held, pauses = await pause_while_holding(
            victim, streams_redis, collector, random.Random(2), Moment.UNPUBLISHED
        )
        left_at_kill = total - collector.event_count()
        shards_at_kill = Counter((await lease_owners(streams_redis)).values())[victim.name]
        victim.kill()
        killed_at = time.monotonic()
        assert left_at_kill > total // 10, "the backlog was drained before the kill"

        await eventually(
            lambda: held_by(streams_redis, survivor.name, SCAN.shards),
            timeout_s=TAKEOVER_BOUND_S,
            what="the survivor holding every shard",
        )
        await eventually(
            lambda: collector.published(held),
            timeout_s=TAKEOVER_BOUND_S,
            what="the killed worker's entries published",
        )
        published_s = collector.last_arrival(held) - killed_at
        ending = await settle_and_check(
            written=written,
            collector=collector,
            streams_redis=streams_redis,
            workers=workers,
            stale_seen=stale_seen,
        )
        drained_s = max(collector.first_arrival.values()) - started
        assert victim.exit_code == -9
        figures("events", total)
        figures("fill (s)", fill_s)
        figures("events left at the kill", left_at_kill)
        figures("shards held by the killed worker", shards_at_kill)
        figures("entries held at the kill", len(held))
        figures("pauses until it held unpublished entries", pauses)
        figures("kill to its entries published (s)", published_s)
        figures("workers started to backlog drained (s)", drained_s)
        assert published_s < TAKEOVER_BOUND_S
        assert ending.events == total


class TestAWorkerPausedPastItsLease:
    async def test_it_is_fenced_on_waking_rejoins_and_no_job_is_reordered(
        self,
        workers: DefaultWorkers,
        collector: TimedCollector,
        streams_server: RedisServer,
        streams_redis: Redis,
        figures: Figures,
    ) -> None:
        sleeper, survivor = await workers.start(2)
        await eventually(lambda: leases_spread(streams_redis, [sleeper, survivor]), what="2 + 2")
        async with PacedLoad(streams_server.url, lanes=LANES, stem="pause", seed=3) as load:
            await load.run_for(1.5)
            held, pauses = await pause_while_holding(
                sleeper, streams_redis, collector, random.Random(3), Moment.UNAPPLIED
            )
            paused_at = time.monotonic()

            await eventually(
                lambda: held_by(streams_redis, survivor.name, SCAN.shards),
                timeout_s=TAKEOVER_BOUND_S,
                every_s=0.02,
                what="the survivor holding every shard",
            )
            taken_s = time.monotonic() - paused_at
            await eventually(
                lambda: collector.published(held),
                timeout_s=TAKEOVER_BOUND_S,
                what="the paused worker's entries published",
            )
            published_s = collector.last_arrival(held) - paused_at
            await asyncio.sleep(paused_at + 15.0 - time.monotonic())
            resume(sleeper)
            woke_at = time.monotonic()

            lost = await eventually(
                lambda: sleeper.metric("event_router_leases_lost_total"),
                what="the woken worker counting its lost leases",
            )
            await eventually(
                lambda: leases_spread(streams_redis, [sleeper, survivor]),
                timeout_s=15.0,
                every_s=0.02,
                what="the shards shared again",
            )
            rebalanced_s = time.monotonic() - woke_at
            await load.run_for(1.5)
            await load.stop()

        ending = await settle_and_check(
            written=load.written,
            collector=collector,
            streams_redis=streams_redis,
            workers=workers,
            stale_seen=0.0,  # both workers are live: their own counts are read at the end
        )
        figures("entries held at the pause", len(held))
        figures("pauses until it held unapplied entries", pauses)
        figures("pause to every shard taken over (s)", taken_s)
        figures("pause to its entries published (s)", published_s)
        figures("leases lost by the woken worker", lost)
        figures("wake to shards shared again (s)", rebalanced_s)
        figures("events", ending.events)
        assert lost > 0
        assert taken_s < TAKEOVER_BOUND_S

    async def test_what_it_applied_before_the_pause_comes_again_only_as_a_duplicate(
        self,
        workers: DefaultWorkers,
        collector: TimedCollector,
        streams_redis: Redis,
        figures: Figures,
    ) -> None:
        # A backlog keeps the worker busy, so a pause soon finds it between apply and publish.
        written = await fill_backlog(streams_redis, jobs=5_000, stem="late")
        sleeper, survivor = await busiest_first(streams_redis, await workers.start(2))
        held, _ = await pause_while_holding(
            sleeper, streams_redis, collector, random.Random(6), Moment.APPLIED_UNPUBLISHED
        )
        paused_at = time.monotonic()
        late = [h for h in held if h.applied and h.key not in collector.first_arrival]
        await eventually(
            lambda: held_by(streams_redis, survivor.name, SCAN.shards),
            timeout_s=TAKEOVER_BOUND_S,
            what="the survivor holding every shard",
        )
        await eventually(
            lambda: collector.published(late),
            timeout_s=TAKEOVER_BOUND_S,
            what="the survivor publishing what the paused worker had applied",
        )
        await asyncio.sleep(paused_at + 6.0 - time.monotonic())
        woke_at = len(collector.messages)
        resume(sleeper)
        await eventually(
            lambda: sleeper.metric("event_router_leases_lost_total"),
            what="the woken worker counting its lost leases",
        )
        await collector.barrier()

        keys = {h.key for h in late}
        again = [
            m.payload
            for m in collector.messages[woke_at:]
            if (m.payload.get("job_id"), m.payload.get("seq")) in keys
        ]
        figures("entries applied and unpublished at the pause", len(late))
        figures("of those published again after the wake", len(again))
        # The publish is the one step a paused router may still finish: what it sends then was
        # published before by the new holder, so a gateway drops it (seq <= last sent).
        before_wake = {
            (m.payload.get("job_id"), m.payload.get("seq")) for m in collector.messages[:woke_at]
        }
        assert all((e["job_id"], e["seq"]) in before_wake for e in again)
        await settle_and_check(
            written=written,
            collector=collector,
            streams_redis=streams_redis,
            workers=workers,
            stale_seen=0.0,
            as_the_gateway_sends=True,
        )


class TestScalingDownAndUp:
    async def test_four_workers_to_one_and_back_lose_nothing_and_share_the_shards(
        self,
        workers: DefaultWorkers,
        collector: TimedCollector,
        streams_server: RedisServer,
        streams_redis: Redis,
        figures: Figures,
    ) -> None:
        crew = await workers.start(4)
        await eventually(lambda: leases_spread(streams_redis, crew), what="one shard each")
        staying, leaving = crew[0], crew[1:]
        async with PacedLoad(streams_server.url, lanes=LANES, stem="scale", seed=4) as load:
            await load.run_for(1.5)
            stale_seen = sum([await stale_count(w) for w in leaving])
            stopping = time.monotonic()
            for worker in leaving:
                worker.terminate()
            codes = [await worker.wait_exit() for worker in leaving]
            exited_s = time.monotonic() - stopping
            assert codes == [0, 0, 0]
            await eventually(
                lambda: held_by(streams_redis, staying.name, SCAN.shards),
                every_s=0.02,
                what="the last worker holding every shard",
            )
            alone_s = time.monotonic() - stopping
            await load.run_for(1.5)

            joining = time.monotonic()
            newcomers = await workers.start(3)
            ready_s = time.monotonic() - joining
            owners = await eventually(
                lambda: leases_spread(streams_redis, [staying, *newcomers]),
                timeout_s=15.0,
                every_s=0.02,
                what="one shard each again",
            )
            shared_s = time.monotonic() - joining
            await load.run_for(1.5)
            await load.stop()

        ending = await settle_and_check(
            written=load.written,
            collector=collector,
            streams_redis=streams_redis,
            workers=workers,
            stale_seen=stale_seen,
        )
        assert sorted(owners.values()) == sorted(w.name for w in [staying, *newcomers])
        figures("SIGTERM to three exits (s)", exited_s)
        figures("SIGTERM to one worker holding all (s)", alone_s)
        figures("three started to ready (s)", ready_s)
        figures("three started to one shard each (s)", shared_s)
        figures("events", ending.events)


class TestARollingRestart:
    async def test_three_workers_restarted_one_by_one_lose_nothing(
        self,
        workers: DefaultWorkers,
        collector: TimedCollector,
        streams_server: RedisServer,
        streams_redis: Redis,
        figures: Figures,
    ) -> None:
        crew = await workers.start(3)
        await eventually(lambda: leases_spread(streams_redis, crew), what="2 + 1 + 1")
        live = list(crew)
        stale_seen = 0.0
        longest_exit_s = 0.0
        async with PacedLoad(streams_server.url, lanes=LANES, stem="roll", seed=5) as load:
            await load.run_for(1.0)
            for old in crew:
                stale_seen += await stale_count(old)
                stopping = time.monotonic()
                old.terminate()
                assert await old.wait_exit() == 0
                longest_exit_s = max(longest_exit_s, time.monotonic() - stopping)
                (new,) = await workers.start(1)
                live = [w for w in live if w is not old] + [new]
                await load.run_for(1.0)
            await eventually(
                lambda: leases_spread(streams_redis, live), timeout_s=15.0, what="2 + 1 + 1"
            )
            await load.run_for(1.0)
            await load.stop()

        ending = await settle_and_check(
            written=load.written,
            collector=collector,
            streams_redis=streams_redis,
            workers=workers,
            stale_seen=stale_seen,
        )
        figures("longest SIGTERM to exit (s)", longest_exit_s)
        figures("events", ending.events)
