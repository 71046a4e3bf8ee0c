"""Fault scenarios against real processes: redis-servers, `eco-router worker`s and a gateway.

Each scenario drives load with the producer, injects one kind of fault, lets the system recover
and checks from the outside that nothing was lost (every entry owed a publish was published, in
stream order, and reached the clients watching its job), no duplicate reached an SSE client and
nothing was stranded; its figures go to `tests/faults/results/<scenario>.json`.

Settings: every router runs with the documented defaults; only the servers' addresses, the
consumer names and the loopback HTTP ports are set (`harness.router_env`). No timeout is
shortened: not the lease TTL (4 s) and renewal (1 s), the reclaimer's idle time (5 min) and
interval (60 s), the blocking read (5 s, which sets the streams socket timeout) or the SSE
keepalive (15 s). Shortening them would only make the suite faster, and the times to recover
depend on them, so each figure is what a deployment with the defaults sees. The
test's own waits are derived from the same defaults (`harness.LEASE_TTL_S` and the rest).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from eco_router.testing import RedisServer
from tests.faults.conftest import OpenRig
from tests.faults.harness import (
    LEASE_TTL_S,
    MALFORMED_REASONS,
    READ_BLOCK_S,
    RECLAIM_INTERVAL_S,
    SOCKET_TIMEOUT_MARGIN_S,
    Entry,
    FaultRig,
    Scenario,
    Sizes,
    until,
)
from tests.integration.support import GROUP, SCAN, WorkerProcess
from tests.tcp_relay import Mode, TcpRelay

pytestmark = pytest.mark.integration

# The moment to inject a fault: this share of the load's events applied.
MID_LOAD = 0.3
# A consumer of the group that reads and never acks, as a wedged process would.
STUCK = "stuck"
# A router's shards pass to the others once its lease lapses: TTL after its last heartbeat.
# Slack on top for routing what it left and for a loaded test machine.
TAKEOVER_BOUND_S = LEASE_TTL_S + 4.0
# How long a worker to be caught holding entries is frozen first (far less than its lease).
PILE_UP_S = 0.3
# Polls of its pending entries (a round trip each) before it is frozen to look again.
WATCH_POLLS = 50


def fault_scenario(number: int, slug: str, title: str, *sizes: Sizes) -> pytest.MarkDecorator:
    """Runs the test as scenario `number` once per load size, each given as its `scenario`."""
    cases = [Scenario(number, slug, title, each) for each in sizes]
    return pytest.mark.parametrize("scenario", cases, ids=lambda case: case.sizes.name)


class TestWorkerKilledMidLoad:
    @fault_scenario(
        1,
        "worker-sigkill",
        "A worker killed with SIGKILL mid-load; its shards are taken over once its lease lapses",
        Sizes("20x20", jobs=20, events=20, pace_s=0.1, malformed=0.02),
        Sizes("60x10", jobs=60, events=10, pace_s=0.3, malformed=0.02, duplicates=0.05, window=3),
    )
    async def test_a_sigkilled_workers_shards_are_taken_over_in_stream_order(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        rig = open_rig(scenario)
        doomed, survivor = await rig.start(workers=2)
        await rig.start_load()
        await rig.load.until_routed(MID_LOAD)

        held = await _catch_holding(rig, doomed)
        doomed.kill()
        rig.recover_from("the kill", also=lambda: _nothing_left_with(rig, doomed.name))
        rig.figures.params |= {"held_by_killed_worker": held}
        rig.require(not rig.load.done, "the load ended before the kill")

        await rig.settle()
        rig.require(held > 0, "the killed worker held no entries: nothing was taken over")
        rig.require(survivor.exit_code is None, "the surviving worker exited")
        owners = await rig.lease_owners()
        rig.require(
            len(owners) == len(SCAN.streams) and doomed.name not in owners.values(),
            f"shards not all taken over: {owners}",
        )
        _recovered_within(rig, TAKEOVER_BOUND_S)
        rig.conclude()


class TestPubSubOutage:
    @fault_scenario(
        2,
        "pubsub-outage",
        "The Pub/Sub Redis stopped for 5 s under load",
        Sizes("30x10", jobs=30, events=10, malformed=0.02),
        Sizes("80x6", jobs=80, events=6, malformed=0.02, duplicates=0.05, window=2),
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
            await rig.start_load()
            await rig.load.until_routed(MID_LOAD)

            gate.set_mode(Mode.HANG_UP)
            await asyncio.to_thread(pubsub_server.stop)
            await asyncio.sleep(outage_s)
            # Applied during the outage, owed a publish once it is over.
            owed = rig.load.applied_keys() - rig.collector.received_keys()
            await asyncio.to_thread(pubsub_server.start)
            await rig.collector.until_subscribed(2)
            gate.set_mode(Mode.PASS)
            rig.recover_from("the outage's end")
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
        Sizes("80x6", jobs=80, events=6, malformed=0.02, duplicates=0.05, window=2),
    )
    async def test_workers_reconnect_to_a_restarted_streams_server_and_continue(
        self, scenario: Scenario, open_rig: OpenRig, durable_streams_server: RedisServer
    ) -> None:
        down_s = 1.5
        rig = open_rig(scenario, streams=durable_streams_server)
        rig.figures.params |= {"down_s": down_s}
        workers = await rig.start(workers=2)
        await rig.start_load()
        await rig.load.until_routed(MID_LOAD)

        await asyncio.to_thread(durable_streams_server.stop)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(durable_streams_server.start)
        rig.recover_from("the restart")

        await rig.settle()
        rig.require(all(w.exit_code is None for w in workers), "a worker exited after the restart")
        rig.conclude()


class TestNetworkFaults:
    @fault_scenario(
        4,
        "network-faults",
        "Connections to both Redis servers slowed, frozen past the socket timeouts and cut",
        Sizes("20x40", jobs=20, events=40, pace_s=0.35, malformed=0.02),
        Sizes("60x24", jobs=60, events=24, pace_s=0.5, malformed=0.02, duplicates=0.05, window=2),
    )
    async def test_stalled_slowed_and_cut_connections_lose_nothing_and_no_worker_exits(
        self,
        scenario: Scenario,
        open_rig: OpenRig,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
    ) -> None:
        # The freeze outlasts the routers' streams socket timeout (the blocking read plus 5 s,
        # 10 s by default) and every lease, so reads, publishes and heartbeats time out.
        freeze_s = READ_BLOCK_S + SOCKET_TIMEOUT_MARGIN_S + 1.5
        phases = [(Mode.SLOW, 2.0), (Mode.PASS, 1.0), (Mode.FREEZE, freeze_s), (Mode.PASS, 1.0)]
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
            await rig.start_load()
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
            rig.recover_from("the faults' end")

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
        Sizes("50x10", jobs=50, events=10, malformed=0.10, duplicates=0.05, window=3),
    )
    async def test_every_malformed_entry_is_dead_lettered_with_its_reason_and_the_rest_routed(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        rig = open_rig(scenario)
        await rig.start(workers=2)
        await rig.start_load()
        # The storm lasts as long as the load: recovery is counted from its last entry.
        await rig.load.finish(timeout_s=60)
        rig.recover_from("the last entry")

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
    # Entries pending with a consumer that is not a router are found by the holder's next
    # read, which looks behind it for entries pending after its last one under another name,
    # and takes the shard over again: they are claimed, found deleted, acked and counted. The
    # reclaimer (every EVENT_ROUTER_RECLAIM_INTERVAL_S, 60 s; XAUTOCLAIM drops deleted
    # entries whatever their idle time) would get them next, hence the bound on the wait.
    @fault_scenario(
        6,
        "trim-before-ack",
        "Streams trimmed (MAXLEN 0) while entries are pending",
        Sizes("30x10", jobs=30, events=10, duplicates=0.05),
        Sizes("80x6", jobs=80, events=6, duplicates=0.05, window=2),
    )
    async def test_entries_trimmed_while_pending_are_counted_and_the_group_keeps_flowing(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        doomed_jobs = 24
        rig = open_rig(scenario)
        await rig.start(workers=2)
        await rig.start_load()
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
        trimmed_at = time.monotonic()
        taken = [
            (stream.decode(), entry_id.decode(), fields)
            for stream, entries in replies[doomed_jobs] or []
            for entry_id, fields in entries
        ]
        # The routers' own batches are routed from memory; only if one is still pending when
        # the reclaimer passes is it claimed, found deleted and counted as well.
        in_flight = sum(
            int(consumer["pending"])
            for summary in replies[doomed_jobs + 1 :: 2]
            for consumer in summary["consumers"] or []
            if consumer["name"].decode() != STUCK
        )
        for n, reply in enumerate(replies[:doomed_jobs]):
            job = f"06-doomed-{n:03d}"
            stream, entry_id = SCAN.stream_for(job), reply.decode()
            rig.own_entries[(stream, entry_id)] = Entry(stream, entry_id, job, 1)
        rig.load.abandon((stream, entry_id) for stream, entry_id, _ in taken)
        rig.known_consumers.add(STUCK)
        rig.recover_from("the trim")
        rig.figures.params |= {"trimmed_while_pending": len(taken), "in_flight_at_trim": in_flight}

        counted = await until(
            lambda: _metric_at_least(rig, "event_router_trimmed_before_ack_total", len(taken)),
            timeout_s=2 * RECLAIM_INTERVAL_S + 30,
            every_s=1.0,
        )
        cleared_s = round(time.monotonic() - trimmed_at, 1)
        rig.figures.params |= {"trimmed_entries_acked_after_s": cleared_s}
        await rig.settle()
        trimmed = await rig.metric_sum("event_router_trimmed_before_ack_total", domain="scan")
        rig.require(counted, "the trimmed entries were never acked by the reclaimer")
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
        Sizes("60x40", jobs=60, events=40, pace_s=0.3, malformed=0.02, duplicates=0.05, window=3),
    )
    async def test_workers_stopped_one_by_one_drain_exit_0_and_lose_or_duplicate_nothing(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        rig = open_rig(scenario)
        originals = await rig.start(workers=3)
        rig.figures.params |= {"workers": len(originals)}
        await rig.start_load()
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
        rig.recover_from("the last restart")

        await rig.settle()
        rig.require(bool(watching), "no SSE client was watching when the gateway stopped")
        rig.require(
            all(v.connections > 1 for v in watching), "an SSE client cut off never reconnected"
        )
        rig.conclude()


class TestWorkerPausedPastItsLease:
    @fault_scenario(
        8,
        "worker-sigstop",
        "A worker paused (SIGSTOP) past its lease under load, then resumed",
        Sizes("24x40", jobs=24, events=40, pace_s=0.25, malformed=0.02, window=2),
        Sizes("48x30", jobs=48, events=30, pace_s=0.35, malformed=0.02, duplicates=0.05, window=3),
    )
    async def test_a_paused_workers_shards_are_taken_over_and_it_is_fenced_out_when_it_resumes(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        pause_s = 2 * LEASE_TTL_S
        rig = open_rig(scenario)
        paused, other = await rig.start(workers=2)
        await rig.start_load()
        await rig.load.until_routed(MID_LOAD)

        held = await _catch_holding(rig, paused)
        stopped_at = time.monotonic()
        rig.recover_from(
            "the pause", at=stopped_at, also=lambda: _nothing_left_with(rig, paused.name)
        )
        await asyncio.sleep(pause_s - (time.monotonic() - stopped_at))
        owners_while_paused = await rig.lease_owners()
        os.kill(paused.process.pid, signal.SIGCONT)
        rig.figures.params |= {"pause_s": pause_s, "held_by_paused_worker": held}
        rig.require(not rig.load.done, "the load ended before the worker resumed")

        # Back in the group, it gets its share again from a router that hands one over.
        regained = await until(lambda: _holds_a_shard(rig, paused.name), timeout_s=15)
        await rig.settle()
        lost = await paused.metric("event_router_leases_lost_total")
        rig.require(held > 0, "the paused worker held no entries")
        rig.require(
            paused.name not in owners_while_paused.values()
            and len(owners_while_paused) == len(SCAN.streams),
            f"shards not taken over during the pause: {owners_while_paused}",
        )
        rig.require(lost > 0, "the resumed worker never noticed it had lost its leases")
        rig.require(regained, "the resumed worker never held a shard again")
        rig.require(
            paused.exit_code is None and other.exit_code is None, "a worker exited after the pause"
        )
        _recovered_within(rig, TAKEOVER_BOUND_S)
        rig.conclude()


class TestBacklogThenKill:
    @fault_scenario(
        9,
        "backlog-sigkill",
        "A backlog written at once, then the worker routing it killed with SIGKILL",
        Sizes(
            "100x30",
            jobs=100,
            events=30,
            backlog=25,
            pace_s=0.05,
            malformed=0.02,
            duplicates=0.05,
            window=2,
        ),
        Sizes("200x20", jobs=200, events=20, backlog=20, malformed=0.02),
    )
    async def test_what_a_killed_worker_left_of_a_backlog_is_routed_in_stream_order(
        self, scenario: Scenario, open_rig: OpenRig
    ) -> None:
        rig = open_rig(scenario)
        workers = await rig.start(workers=2)
        # Every router holds its share before the backlog lands (2 of 4 shards for one).
        names = [w.name for w in workers]
        settled = await until(lambda: _shares_settled(rig, names), timeout_s=15)
        rig.require(settled, "the shards were never shared out before the backlog")
        owners = await rig.lease_owners()
        doomed = max(workers, key=lambda w: sum(o == w.name for o in owners.values()))
        doomed_shards = [s for s, o in owners.items() if o == doomed.name]

        # Frozen while the backlog lands (far less than its lease), so it is caught holding
        # the first batch of it, with the rest of its shards' backlog unread.
        os.kill(doomed.process.pid, signal.SIGSTOP)
        await rig.start_load()
        os.kill(doomed.process.pid, signal.SIGCONT)
        held = await _catch_holding(rig, doomed)
        unrouted = rig.unpublished(doomed_shards)
        doomed.kill()
        rig.recover_from("the kill", also=lambda: _nothing_left_with(rig, doomed.name))
        rig.figures.params |= {
            "held_by_killed_worker": held,
            "entries_written_at_kill": len(rig.load.written),
            "unrouted_on_its_shards_at_kill": unrouted,
        }

        await rig.settle()
        rig.require(held > 0, "the killed worker held no entries")
        rig.require(unrouted >= 100, f"only {unrouted} entries left on its shards: no backlog")
        _recovered_within(rig, TAKEOVER_BOUND_S + 4.0)
        rig.conclude()


async def _catch_holding(rig: FaultRig, worker: WorkerProcess, timeout_s: float = 15.0) -> int:
    """Freeze `worker` (SIGSTOP) at a moment it holds entries read and not acked.

    Returns how many; the worker stays frozen. Between tries it runs on for a few
    milliseconds, far less than its lease.
    """
    deadline = time.monotonic() + timeout_s
    # Entries pile up on its shards first, so the first moments after it resumes find it
    # routing a large batch, however fast the load ends.
    os.kill(worker.process.pid, signal.SIGSTOP)
    await asyncio.sleep(PILE_UP_S)
    while True:
        os.kill(worker.process.pid, signal.SIGSTOP)
        held = await rig.pending_of(worker.name)
        if held or time.monotonic() > deadline:
            return held
        os.kill(worker.process.pid, signal.SIGCONT)
        # Watch it closely: the moment it has read a batch, freeze it before the ack.
        for _ in range(WATCH_POLLS):
            if await rig.pending_of(worker.name):
                break


def _recovered_within(rig: FaultRig, bound_s: float) -> None:
    recovery_s = rig.figures.recovery_s
    rig.require(
        recovery_s <= bound_s,
        f"recovered {recovery_s} s after {rig.figures.recovery_from} (bound {bound_s} s)",
    )


async def _stop_gracefully(rig: FaultRig, router: WorkerProcess) -> None:
    """SIGTERM; the router must drain (nothing left pending under its name) and exit 0."""
    router.terminate()
    code = await router.wait_exit(timeout_s=20)
    rig.require(code == 0, f"{router.name} exited with {code}")
    left = await rig.pending_of(router.name)
    rig.require(left == 0, f"{router.name} exited with {left} entries pending")


async def _nothing_left_with(rig: FaultRig, consumer: str) -> bool:
    return await rig.pending_of(consumer) == 0


async def _holds_a_shard(rig: FaultRig, router: str) -> bool:
    return router in (await rig.lease_owners()).values()


async def _shares_settled(rig: FaultRig, workers: list[str]) -> bool:
    """Every shard leased, and every worker holding one."""
    owners = await rig.lease_owners()
    return len(owners) == len(SCAN.streams) and all(w in owners.values() for w in workers)


async def _metric_at_least(rig: FaultRig, sample: str, minimum: float) -> bool:
    return await rig.metric_sum(sample) >= minimum
