"""Fault scenarios against real processes: redis-servers, `eco-router worker`s and a gateway.

Each scenario drives load with the producer, injects one fault, lets the system recover and
checks from the outside that nothing was lost, no duplicate reached an SSE client and nothing
was stranded; its figures go to `tests/faults/results/<scenario>.json`.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from eco_router.testing import RedisServer
from tests.faults.conftest import OpenRig
from tests.faults.harness import MALFORMED_REASONS, FaultRig, Scenario, Sizes, until
from tests.integration.support import GROUP, SCAN, WorkerProcess
from tests.tcp_relay import Mode, TcpRelay

pytestmark = pytest.mark.integration

# The moment to inject a fault: this share of the load's events applied.
MID_LOAD = 0.3
# A consumer of the group that reads and never acks, as a wedged process would.
STUCK = "stuck"


def fault_scenario(number: int, slug: str, title: str, *sizes: Sizes) -> pytest.MarkDecorator:
    """Runs the test as scenario `number` once per load size, each given as its `scenario`."""
    cases = [Scenario(number, slug, title, each) for each in sizes]
    return pytest.mark.parametrize("scenario", cases, ids=lambda case: case.sizes.name)


class TestWorkerKilledMidLoad:
    @fault_scenario(
        1,
        "worker-sigkill",
        "A worker killed with SIGKILL mid-load; the other reclaims its entries",
        Sizes("20x12", jobs=20, events=12, malformed=0.02),
        Sizes("60x8", jobs=60, events=8, malformed=0.02, duplicates=0.05),
    )
    async def test_the_other_worker_reclaims_what_a_sigkilled_worker_held(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        rig = open_rig(scenario)
        doomed, survivor = await rig.start(workers=2)
        rig.start_load()
        await rig.load.until_routed(MID_LOAD)

        # Frozen first, so it is caught holding entries (read, not acked), then killed.
        os.kill(doomed.process.pid, signal.SIGSTOP)
        await until(lambda: _holds_entries(rig, doomed.name), timeout_s=10, every_s=0.01)
        held = await rig.pending_of(doomed.name)
        doomed.kill()
        rig.fault_over(also=lambda: _nothing_left_with(rig, doomed.name))
        rig.figures.params |= {"held_by_killed_worker": held}
        rig.require(not rig.load.done, "the load ended before the kill")

        await rig.settle()
        reclaimed = await rig.metric_sum("event_router_reclaimed_total")
        rig.require(held > 0, "the killed worker held no entries: nothing was reclaimed")
        rig.require(reclaimed >= held, f"reclaimed {reclaimed} of the {held} held entries")
        rig.require(survivor.exit_code is None, "the surviving worker exited")
        rig.conclude()


class TestPubSubOutage:
    @fault_scenario(
        2,
        "pubsub-outage",
        "The Pub/Sub Redis stopped for 5 s under load",
        Sizes("30x10", jobs=30, events=10, malformed=0.02),
        Sizes("80x6", jobs=80, events=6, malformed=0.02, duplicates=0.05),
    )
    async def test_events_routed_while_pubsub_is_down_reach_subscribers_after_it_returns(
        self, scenario: Scenario, open_rig: OpenRig, pubsub_server: RedisServer
    ) -> None:
        outage_s = 5.0
        # Routers reach Pub/Sub through a gate that opens once the test's subscriber is back
        # on the restarted server: nothing is published to nobody.
        async with TcpRelay(pubsub_server.port) as gate:
            rig = open_rig(scenario, router_pubsub_url=gate.url)
            rig.figures.params |= {"outage_s": outage_s}
            await rig.start(workers=2)
            rig.start_load()
            await rig.load.until_routed(MID_LOAD)

            gate.set_mode(Mode.HANG_UP)
            await asyncio.to_thread(pubsub_server.stop)
            await asyncio.sleep(outage_s)
            # Applied during the outage, owed a publish once it is over.
            owed = rig.load.applied_keys() - rig.collector.received_keys()
            await asyncio.to_thread(pubsub_server.start)
            await rig.collector.until_subscribed(2)
            gate.set_mode(Mode.PASS)
            rig.fault_over()
            rig.figures.params |= {"applied_unpublished_during_outage": len(owed)}

            await rig.settle()
            failed = await rig.metric_sum("event_router_publish_errors_total")
            rig.require(len(owed) > 0, "no event was applied and left unpublished by the outage")
            rig.require(failed > 0, "no publish failed: the outage was not felt")
            rig.conclude()


class TestStreamsServerRestart:
    @fault_scenario(
        3,
        "streams-restart",
        "The streams Redis (append-only) restarted under load",
        Sizes("30x10", jobs=30, events=10, malformed=0.02),
        Sizes("80x6", jobs=80, events=6, malformed=0.02, duplicates=0.05),
    )
    async def test_workers_reconnect_to_a_restarted_streams_server_and_continue(
        self, scenario: Scenario, open_rig: OpenRig, durable_streams_server: RedisServer
    ) -> None:
        down_s = 1.5
        rig = open_rig(scenario, streams=durable_streams_server)
        rig.figures.params |= {"down_s": down_s}
        workers = await rig.start(workers=2)
        rig.start_load()
        await rig.load.until_routed(MID_LOAD)

        await asyncio.to_thread(durable_streams_server.stop)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(durable_streams_server.start)
        rig.fault_over()

        await rig.settle()
        rig.require(all(w.exit_code is None for w in workers), "a worker exited after the restart")
        rig.conclude()


class TestNetworkFaults:
    @fault_scenario(
        4,
        "network-faults",
        "Connections to both Redis servers slowed, frozen and cut",
        Sizes("20x30", jobs=20, events=30, pace_s=0.25, malformed=0.02),
        Sizes("60x20", jobs=60, events=20, pace_s=0.35, malformed=0.02, duplicates=0.05),
    )
    async def test_stalled_slowed_and_cut_connections_lose_nothing_and_no_worker_exits(
        self,
        scenario: Scenario,
        open_rig: OpenRig,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
    ) -> None:
        # The freeze outlasts the socket timeouts (5 s), so reads and publishes time out.
        phases = [(Mode.SLOW, 2.0), (Mode.PASS, 1.0), (Mode.FREEZE, 6.5), (Mode.PASS, 1.0)]
        phases += [(Mode.CUT, 2.0)]
        async with (
            TcpRelay(streams_server.port) as streams_relay,
            TcpRelay(pubsub_server.port) as pubsub_relay,
        ):
            relays = (streams_relay, pubsub_relay)
            rig = open_rig(
                scenario, router_streams_url=streams_relay.url, router_pubsub_url=pubsub_relay.url
            )
            rig.figures.params |= {"phases": [[mode.value, seconds] for mode, seconds in phases]}
            workers = await rig.start(workers=2)
            rig.start_load()
            await rig.load.until_routed(MID_LOAD)

            for mode, seconds in phases:
                for relay in relays:
                    relay.set_mode(mode)
                await asyncio.sleep(seconds)
                exited = [p.name for p in (*workers, rig.gateway) if p.exit_code is not None]
                rig.require(not exited, f"{exited} exited during {mode.value}")
            for relay in relays:
                relay.set_mode(Mode.PASS)
            rig.require(not rig.load.done, "the load ended before the faults did")
            rig.fault_over()

            await rig.settle()
            for worker in workers:
                rig.require(worker.exit_code is None, f"{worker.name} exited")
                if worker.exit_code is None:
                    health = await worker.get("/health")
                    rig.require(health.status_code == 200, f"{worker.name} /health {health}")
            rig.require(streams_relay.reset > 0, "the cut reset no connection")
            rig.conclude()


class TestPoisonStorm:
    @fault_scenario(
        5,
        "poison-storm",
        "10% malformed entries mixed into the load",
        Sizes("20x10", jobs=20, events=10, malformed=0.10, duplicates=0.05),
        Sizes("50x10", jobs=50, events=10, malformed=0.10, duplicates=0.05),
    )
    async def test_every_malformed_entry_is_dead_lettered_with_its_reason_and_the_rest_routed(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        rig = open_rig(scenario)
        await rig.start(workers=2)
        rig.start_load()
        # The storm lasts as long as the load: recovery is counted from its last entry.
        await rig.load.finish(timeout_s=60)
        rig.fault_over()

        await rig.settle()
        letters = await rig.dead_letters()
        share = len(rig.load.malformed) / len(rig.load.sent)
        rig.require(
            abs(share - scenario.sizes.malformed) < 0.01, f"{share:.3f} of entries malformed"
        )
        rig.require(
            len(letters) == len({key for key, _ in letters}), "an entry was dead-lettered twice"
        )
        reasons = {reason for _, reason in letters}
        rig.require(reasons == {r.value for r in MALFORMED_REASONS}, f"reasons: {sorted(reasons)}")
        rig.conclude()


class TestTrimBeforeAck:
    @fault_scenario(
        6,
        "trim-before-ack",
        "Streams trimmed (MAXLEN 0) while entries are pending",
        Sizes("30x10", jobs=30, events=10, duplicates=0.05),
        Sizes("80x6", jobs=80, events=6, duplicates=0.05),
    )
    async def test_entries_trimmed_while_pending_are_counted_and_the_group_keeps_flowing(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        doomed_jobs = 24
        rig = open_rig(scenario)
        await rig.start(workers=2)
        rig.start_load()
        await rig.load.until_routed(MID_LOAD)

        # In one transaction: a consumer that will never ack takes everything not yet
        # delivered (fresh entries of its own and whatever the load just wrote), then every
        # shard is trimmed to nothing while those entries and the routers' batches are pending.
        async with rig.redis.pipeline(transaction=True) as pipe:
            for n in range(doomed_jobs):
                job = f"06-doomed-{n:03d}"
                pipe.xadd(SCAN.stream_for(job), {"job_id": job, "seq": 1, "stage": "vision"})
            pipe.xreadgroup(GROUP, STUCK, dict.fromkeys(SCAN.streams, ">"), count=100_000)
            for stream in SCAN.streams:
                pipe.xpending(stream, GROUP)
                pipe.xtrim(stream, maxlen=0, approximate=False)
            replies = await pipe.execute()
        taken = [
            (stream.decode(), entry_id.decode(), fields)
            for stream, entries in replies[doomed_jobs] or []
            for entry_id, fields in entries
        ]
        # The routers' own batches are routed from memory; only if one takes longer than the
        # reclaim idle time is it claimed, found deleted and counted as well.
        in_flight = sum(
            int(consumer["pending"])
            for summary in replies[doomed_jobs + 1 :: 2]
            for consumer in summary["consumers"] or []
            if consumer["name"].decode() != STUCK
        )
        rig.load.abandon(
            (fields[b"job_id"].decode(), int(fields[b"seq"]))
            for stream, entry_id, fields in taken
            if rig.load.events.get((fields[b"job_id"].decode(), int(fields[b"seq"])))
            == (stream, entry_id)
        )
        rig.known_consumers.add(STUCK)
        rig.fault_over(
            also=lambda: _metric_at_least(rig, "event_router_trimmed_before_ack_total", len(taken))
        )
        rig.figures.params |= {"trimmed_while_pending": len(taken), "in_flight_at_trim": in_flight}

        await rig.settle()
        trimmed = await rig.metric_sum("event_router_trimmed_before_ack_total", domain="scan")
        rig.require(len(taken) >= doomed_jobs, f"only {len(taken)} entries taken")
        rig.require(
            len(taken) <= trimmed <= len(taken) + in_flight,
            f"trimmed-before-ack {trimmed} for {len(taken)} trimmed and {in_flight} in flight",
        )
        rig.conclude()


class TestRollingRestart:
    @fault_scenario(
        7,
        "rolling-restart",
        "The gateway, then each worker, stopped with SIGTERM one by one under load",
        Sizes("24x80", jobs=24, events=80, pace_s=0.15, malformed=0.02, duplicates=0.05),
        Sizes("60x40", jobs=60, events=40, pace_s=0.3, malformed=0.02, duplicates=0.05),
    )
    async def test_workers_stopped_one_by_one_drain_exit_0_and_lose_or_duplicate_nothing(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        rig = open_rig(scenario)
        originals = await rig.start(workers=3)
        rig.figures.params |= {"workers": len(originals)}
        rig.start_load()
        await rig.load.until_routed(0.15)

        # The gateway first: it is a router replica too, and its SSE clients, cut mid-job,
        # reconnect to its successor with their Last-Event-ID.
        old_gateway = rig.gateway
        await rig.start_gateway()
        watching = [v for v in rig.viewers if not v.finished]
        await _stop_gracefully(rig, old_gateway)
        for worker in originals:
            await _stop_gracefully(rig, worker)
            await rig.start_worker()
        rig.require(not rig.load.done, "the load ended before the last restart")
        rig.fault_over()

        await rig.settle()
        rig.require(bool(watching), "no SSE client was watching when the gateway stopped")
        rig.require(
            all(v.connections > 1 for v in watching), "an SSE client cut off never reconnected"
        )
        rig.conclude()


async def _holds_entries(rig: FaultRig, consumer: str) -> bool:
    return await rig.pending_of(consumer) > 0


async def _stop_gracefully(rig: FaultRig, router: WorkerProcess) -> None:
    """SIGTERM; the router must drain (nothing left pending under its name) and exit 0."""
    router.terminate()
    code = await router.wait_exit(timeout_s=20)
    rig.require(code == 0, f"{router.name} exited with {code}")
    left = await rig.pending_of(router.name)
    rig.require(left == 0, f"{router.name} exited with {left} entries pending")


async def _nothing_left_with(rig: FaultRig, consumer: str) -> bool:
    return await rig.pending_of(consumer) == 0


async def _metric_at_least(rig: FaultRig, sample: str, minimum: float) -> bool:
    return await rig.metric_sum(sample) >= minimum
