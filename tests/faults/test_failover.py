"""Failover under load on Redis Sentinel and on a Redis Cluster.

The master of the streams, or of Pub/Sub, is killed with SIGKILL while the producer writes
(with duplicates and malformed entries) and SSE clients watch jobs through a gateway; a
replica is promoted, and the killed node is started again and rejoins as a replica, as a
crashed pod would. The other role runs on a server of its own, as in production: one Pub/Sub
server beside the streams deployment, or a streams server with one replica (so WAIT 1 is
answered) beside the Pub/Sub deployment.

Each case runs at two durability settings: the defaults (no WAIT: the producer returns once
the master has an entry, the routers publish once the master has a batch's state writes) and
WAIT 1 on both (`wait_replicas=1` in the producer, `EVENT_ROUTER_WAIT_REPLICAS=1` in every
router). Without WAIT, replication is asynchronous: an entry the master acknowledged and died
with before any replica had it is gone, and if no router had published it yet it is lost.
That loss is measured (`lost_unreplicated`), not failed on; every other loss fails, as does
any acknowledged entry gone with WAIT 1, any duplicate at an SSE client and anything left
pending at the end.

Routers run with the documented defaults but for the WAIT setting under test; the
Sentinel's down-after (1 s) and the cluster's node timeout (1 s) are the deployments' own
configuration. "Time to recover" runs from the kill until every entry owed a publish that was
written by the time the promotion was seen (and not gone with the master) is published and
every malformed one dead-lettered; it is never shorter than the promotion as seen here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from eco_router.domain.streams import key_slot
from eco_router.testing import ClusterGroup, RedisServer, SentinelGroup
from tests.faults.harness import FaultRig, Scenario, Sizes, family_on
from tests.faults.observers import Collector, EveryNodeCollector
from tests.integration.support import CHANNEL_PREFIX
from tests.integration.topology_fixtures import Shared

pytestmark = pytest.mark.integration

# The moment of the kill: this share of the load's events applied.
MID_LOAD = 0.3

Topology = Literal["sentinel", "cluster"]
Role = Literal["streams", "pubsub"]


def _sizes(name: str, wait: int) -> Sizes:
    settings = (("EVENT_ROUTER_WAIT_REPLICAS", str(wait)),) if wait else ()
    # Paced to outlast the failover by several seconds (a Sentinel group's former master is
    # back as a replica later still: Sentinel converts it after 8 s in the wrong role).
    return Sizes(
        name,
        jobs=24,
        events=50,
        pace_s=0.3,
        malformed=0.02,
        duplicates=0.05,
        window=2,
        settings=settings,
        producer_wait_replicas=wait,
    )


DURABILITY = (_sizes("wait-off", 0), _sizes("wait-1", 1))
TOPOLOGY_NAMES = {"sentinel": "Redis Sentinel", "cluster": "Redis Cluster"}


@dataclass(frozen=True, slots=True)
class Failover:
    """Which deployment fails over, and the master of which role is killed."""

    topology: Topology
    role: Role
    number: int

    def scenario(self, sizes: Sizes) -> Scenario:
        title = (
            f"{TOPOLOGY_NAMES[self.topology]}: the {self.role.replace('pubsub', 'Pub/Sub')} "
            "master killed (SIGKILL) under load, a replica promoted, the node back as a replica"
        )
        return Scenario(self.number, f"{self.topology}-{self.role}-failover", title, sizes)


FAILOVERS = (
    Failover("sentinel", "streams", 11),
    Failover("sentinel", "pubsub", 12),
    Failover("cluster", "streams", 13),
    Failover("cluster", "pubsub", 14),
)
CASES = [
    pytest.param(case, case.scenario(sizes), id=f"{case.topology}-{case.role}-{sizes.name}")
    for case in FAILOVERS
    for sizes in DURABILITY
]


@pytest.fixture
def group(request: pytest.FixtureRequest, case: Failover) -> Iterator[SentinelGroup | ClusterGroup]:
    """The case's deployment, healthy and empty; stopped afterwards (a failover broke it)."""
    fixture = "sentinel_group" if case.topology == "sentinel" else "redis_cluster"
    shared: Shared[SentinelGroup] | Shared[ClusterGroup] = request.getfixturevalue(
        f"shared_{case.topology}"
    )
    yield request.getfixturevalue(fixture)
    shared.broken = True
    shared.stop()


class TestFailoverUnderLoad:
    @pytest.mark.parametrize(("case", "scenario"), CASES)
    async def test_a_promoted_replica_takes_over_and_nothing_is_duplicated_or_left_pending(
        self,
        case: Failover,
        scenario: Scenario,
        group: SentinelGroup | ClusterGroup,
        request: pytest.FixtureRequest,
        tmp_path: Path,
    ) -> None:
        durable = scenario.sizes.producer_wait_replicas > 0
        async with contextlib.AsyncExitStack() as stack:
            if case.role == "streams":
                beside: RedisServer = request.getfixturevalue("pubsub_server")
                streams_url, pubsub_url = group.url, beside.url
                observe = None
            else:
                beside = request.getfixturevalue("replicated_server")
                streams_url, pubsub_url = beside.url, group.url
                observe = _observer(group)
            rig = FaultRig(
                tmp_path, scenario, streams_url=streams_url, pubsub_url=pubsub_url, observe=observe
            )
            stack.push_async_callback(rig.aclose)
            rig.unreplicated_loss_allowed = not durable
            rig.figures.params |= {
                "topology": TOPOLOGY_NAMES[case.topology],
                "master_killed": "Pub/Sub" if case.role == "pubsub" else "streams",
                "wait": "1 (producer and routers)" if durable else "off",
            }
            workers = await rig.start(workers=2)
            await rig.start_load()
            await rig.load.until_routed(MID_LOAD)

            victim = _victim(group, case, rig)
            killed_at = time.monotonic()
            _kill(group, victim)
            await asyncio.to_thread(_wait_for_promotion, group, victim)
            promoted_s = round(time.monotonic() - killed_at, 2)
            rig.require(not rig.load.done, "the load ended before the replica was promoted")
            # Owed from here: what was written until the promotion, so what the routers could
            # not publish while the Pub/Sub master was down counts too.
            rig.recover_from("the kill", at=killed_at)
            vanished = await rig.find_vanished() if case.role == "streams" else set()
            await asyncio.to_thread(group.restart, victim)
            back_s = round(time.monotonic() - killed_at, 2)

            await rig.settle(timeout_s=120)
            rig.figures.params |= {
                "replica_promoted_after_s": promoted_s,
                "killed_node_back_as_replica_after_s": back_s,
                "acknowledged_entries_gone_with_the_master": len(vanished),
                "lost_unreplicated": rig.figures.lost_unreplicated,
                "pending_at_end": rig.findings.pending,
                "publish_errors": await rig.metric_sum("event_router_publish_errors_total"),
            }
            if durable:
                rig.require(
                    not vanished,
                    f"{len(vanished)} entries acknowledged with WAIT 1 gone after the failover: "
                    f"{sorted(vanished)[:10]}",
                )
            # Without WAIT, the streams master may take acknowledged state writes with it (or
            # a returning old master may take them, as it is made a replica): a job's stored
            # state can end behind what its viewers got. Measured, as the loss is; with WAIT 1
            # it fails the test like any other wrong state.
            rolled_back = dict(rig.findings.wrong_states)
            rig.figures.params["job_states_behind_at_end"] = len(rolled_back)
            if not durable and case.role == "streams":
                rig.findings.wrong_states.clear()
            for router in (*workers, rig.gateway):
                rig.require(router.exit_code is None, f"{router.name} exited")
            rig.conclude()


def _observer(group: SentinelGroup | ClusterGroup) -> Callable[[Sequence[str]], Collector]:
    if isinstance(group, SentinelGroup):
        return lambda _jobs: EveryNodeCollector.on_sentinel(group)
    return lambda jobs: EveryNodeCollector.on_cluster(group, jobs)


def _victim(group: SentinelGroup | ClusterGroup, case: Failover, rig: FaultRig) -> RedisServer:
    """The master to kill: the Sentinel group's; on a cluster, for the streams the master of
    the most scan shards, for Pub/Sub the master of the first watched job's channel."""
    if isinstance(group, SentinelGroup):
        return group.master()
    if case.role == "streams":
        masters = Counter(
            group.master_for_slot(key_slot(stream)).port for stream in family_on(group.url).streams
        )
        port = masters.most_common(1)[0][0]
        return next(shard.master for shard in group.masters() if shard.master.port == port)
    watched = rig.viewers[0].job_id
    return group.master_for_slot(key_slot(f"{CHANNEL_PREFIX}:{watched}"))


def _kill(group: SentinelGroup | ClusterGroup, master: RedisServer) -> None:
    if isinstance(group, ClusterGroup):
        group.kill(master)
    else:
        master.kill()


def _wait_for_promotion(group: SentinelGroup | ClusterGroup, old: RedisServer) -> RedisServer:
    if isinstance(group, ClusterGroup):
        return group.wait_for_failover(old)
    return group.wait_for_new_master(old)


# Scenario 15: a failover asked of Sentinel while the master is healthy (an operator, a rolling
# update of the Redis pods). The old master is neither killed nor paused: it stays up and
# accepts writes until Sentinel turns it into a replica of the promoted one, which then throws
# away whatever was written to it meanwhile. Clients that go on writing to it lose those
# writes; with WAIT 1 nothing acknowledged may be among them.
COMMANDED = Failover("sentinel", "streams", 15)


class TestFailoverAskedOfSentinelUnderLoad:
    @pytest.mark.parametrize(
        ("case", "scenario"),
        [
            pytest.param(
                COMMANDED,
                Scenario(
                    COMMANDED.number,
                    "sentinel-streams-commanded-failover",
                    "Redis Sentinel: SENTINEL FAILOVER under load, the old master up and "
                    "writable until Sentinel demotes it",
                    sizes,
                ),
                id=f"sentinel-streams-commanded-{sizes.name}",
            )
            for sizes in DURABILITY
        ],
    )
    async def test_nothing_acknowledged_with_wait_is_lost_and_the_old_master_is_left_at_once(
        self,
        case: Failover,
        scenario: Scenario,
        group: SentinelGroup,
        pubsub_server: RedisServer,
        tmp_path: Path,
    ) -> None:
        durable = scenario.sizes.producer_wait_replicas > 0
        async with contextlib.AsyncExitStack() as stack:
            rig = FaultRig(tmp_path, scenario, streams_url=group.url, pubsub_url=pubsub_server.url)
            stack.push_async_callback(rig.aclose)
            rig.unreplicated_loss_allowed = not durable
            rig.figures.params |= {
                "topology": TOPOLOGY_NAMES[case.topology],
                "failover": "SENTINEL FAILOVER (old master up)",
                "wait": "1 (producer and routers)" if durable else "off",
            }
            workers = await rig.start(workers=2)
            await rig.start_load()
            await rig.load.until_routed(MID_LOAD)

            asked_at = time.monotonic()
            asked_ms = int(time.time() * 1000)
            old = group.failover()
            await asyncio.to_thread(group.wait_for_new_master, old)
            promoted_ms = int(time.time() * 1000)
            promoted_s = round(time.monotonic() - asked_at, 2)
            rig.require(not rig.load.done, "the load ended before the replica was promoted")
            rig.recover_from("the failover", at=asked_at)
            await asyncio.to_thread(group.wait_rejoined, old, 60.0)
            demoted_s = round(time.monotonic() - asked_at, 2)
            # Only now is the old master's own history replaced by the new master's.
            vanished = await rig.find_vanished()
            # Entry ids carry the writing master's clock (one machine here): the last write
            # the old master took after the promotion closes the window in which it was used.
            written_ms = [int(entry_id.partition("-")[0]) for _, entry_id in vanished]
            window_ms = max((ms - promoted_ms for ms in written_ms), default=0)

            await rig.settle(timeout_s=120)
            rig.figures.params |= {
                "replica_promoted_after_s": promoted_s,
                "old_master_a_replica_after_s": demoted_s,
                "acknowledged_entries_gone_with_the_old_master": len(vanished),
                "old_master_written_after_promotion_ms": max(0, window_ms),
                "written_from_failover_asked_ms": (max(written_ms) - asked_ms if written_ms else 0),
                "lost_unreplicated": rig.figures.lost_unreplicated,
                "pending_at_end": rig.findings.pending,
            }
            if durable:
                rig.require(
                    not vanished,
                    f"{len(vanished)} entries acknowledged with WAIT 1 gone after the failover: "
                    f"{sorted(vanished)[:10]}",
                )
            rolled_back = dict(rig.findings.wrong_states)
            rig.figures.params["job_states_behind_at_end"] = len(rolled_back)
            if not durable:
                rig.findings.wrong_states.clear()
            for router in (*workers, rig.gateway):
                rig.require(router.exit_code is None, f"{router.name} exited")
            rig.conclude()
