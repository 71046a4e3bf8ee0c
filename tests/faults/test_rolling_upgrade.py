"""A rolling upgrade from the release that judged every event in Lua, and the rollback to it.

The previous release (`PREVIOUS_RELEASE`, its `src/` taken with `git archive`) judged each
batch inside `apply_batch.lua`; this tree judges in `domain.settle`, holds job records under
the shard's fencing token and stores the writes with `store_batch.lua`, on the same keys and
fields. Both run in one consumer group here, on the test's own servers, with the documented
defaults (only the addresses, consumer names and loopback HTTP ports set, as in every fault
scenario): two workers and a gateway (router inside) of one release are replaced one at a
time by the other's while the producer keeps writing, malformed entries and retried seqs
included. After each replacement every job's last applied event is appended again, as a
producer retrying outside its idempotency window does: the router of the other release that
now holds the shard must judge it a duplicate from what the first one stored.

Checked from the outside, as in every scenario (`FaultRig.conclude`), and besides: every
owed event published exactly once on Pub/Sub, in seq order, and each job's history, the list
a gateway replays, holds exactly its owed events in order.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from bench.baseline_source import baseline_source
from bench.router_process import REPOSITORY_ROOT

from eco_router.adapters.redis.keys import JobKeys
from eco_router.adapters.redis.scripts import load_lua
from tests.faults.conftest import OpenRig
from tests.faults.harness import FaultRig, Scenario, Sizes

pytestmark = pytest.mark.integration

# The last commit whose router judged in Lua (apply_batch.lua).
PREVIOUS_RELEASE = "f609f79"
# The script each release stores a batch with, as shipped in its package.
LUA = Path("eco_router/adapters/redis/lua")
PREVIOUS_SCRIPT, CURRENT_SCRIPT = "apply_batch.lua", "store_batch.lua"
# A router's SIGTERM drain (up to 8 s) and a loaded machine.
EXIT_TIMEOUT_S = 30.0
# The moments to replace the routers: these shares of the load's events applied.
REPLACE_AT = (0.2, 0.4)

# Long enough (about 30 events a job, 0.3 s apart) to outlast the three replacements.
SIZES = Sizes("40x30", jobs=40, events=30, pace_s=0.3, malformed=0.02, duplicates=0.05, window=2)
UPGRADE = Scenario(
    18,
    "rolling-upgrade",
    f"Routers of {PREVIOUS_RELEASE} (judging in Lua) replaced one at a time by this tree's",
    SIZES,
)
ROLLBACK = Scenario(
    19,
    "rolling-rollback",
    f"This tree's routers replaced one at a time by {PREVIOUS_RELEASE}'s (judging in Lua)",
    SIZES,
)


@pytest.fixture(scope="module")
def previous_release() -> Iterator[Path]:
    """The previous release's `src/`, unpacked outside the checkout."""
    try:
        found = subprocess.run(
            ["git", "-C", str(REPOSITORY_ROOT), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        pytest.skip("git is not installed: the previous release's source cannot be taken")
    if found.returncode != 0:
        pytest.skip(f"{PREVIOUS_RELEASE} is not in this clone (a shallow one?): no old router")
    # Any other failure (it does not unpack or import) fails the test.
    with baseline_source(PREVIOUS_RELEASE) as source:
        yield source.src


class TestRollingUpgrade:
    @pytest.mark.parametrize("scenario", [UPGRADE, ROLLBACK], ids=["upgrade", "rollback"])
    async def test_routers_of_both_releases_in_one_group_lose_nothing(
        self, scenario: Scenario, open_rig: OpenRig, previous_release: Path
    ) -> None:
        before, after = (
            (previous_release, None) if scenario is UPGRADE else (None, previous_release)
        )
        rig = open_rig(scenario)
        workers = await rig.start(workers=2, release=before)
        await rig.start_load()

        retried = 0
        for worker, share in zip(workers, REPLACE_AT, strict=True):
            await rig.load.until_routed(share)
            worker.terminate()
            code = await worker.wait_exit(EXIT_TIMEOUT_S)
            rig.require(code == 0, f"{worker.name} exited with {code} on SIGTERM")
            await rig.start_worker(after)
            retried += await rig.load.retry_applied()
        # The gateway last: the new one takes the address viewers connect to, then the old
        # one ends its streams and its viewers resume there with their Last-Event-ID.
        old_gateway = rig.gateway
        await rig.start_gateway(after)
        await asyncio.to_thread(old_gateway.stop)
        rig.require(old_gateway.exit_code == 0, f"the old gateway exited {old_gateway.exit_code}")
        retried += await rig.load.retry_applied()
        rig.recover_from("the last router replaced")
        rig.figures.params |= {"previous_release": PREVIOUS_RELEASE, "retried_after": retried}
        rig.require(not rig.load.done, "the load ended before the last router was replaced")

        await rig.settle(timeout_s=120.0)
        await _both_releases_stored_batches(rig, previous_release)
        _published_once_in_order(rig)
        await _histories_hold_what_was_owed(rig)
        rig.conclude()


async def _both_releases_stored_batches(rig: FaultRig, previous_release: Path) -> None:
    """Both releases' store scripts ran on the streams server (it caches what it ran): the
    routers of each release really imported their own `eco_router`."""
    scripts = {
        PREVIOUS_SCRIPT: (previous_release / LUA / PREVIOUS_SCRIPT).read_text(),
        CURRENT_SCRIPT: load_lua(CURRENT_SCRIPT),
    }
    digests = [hashlib.sha1(text.encode()).hexdigest() for text in scripts.values()]
    cached = await rig.redis.script_exists(*digests)
    for name, found in zip(scripts, cached, strict=True):
        rig.require(bool(found), f"no router ran {name}: one release never stored a batch")


def _published_once_in_order(rig: FaultRig) -> None:
    """Every job's events on Pub/Sub: each owed seq once, in seq order, nothing else."""
    owed = rig.load.owed()
    for job in rig.load.jobs:
        seqs = [int(m.payload["seq"]) for m in rig.collector.messages if m.payload["job_id"] == job]
        expected = [e.seq for e in owed.get(job, [])]
        if seqs != expected:
            twice = sorted(s for s, n in Counter(seqs).items() if n > 1)
            rig.require(False, f"{job} published {seqs} (twice: {twice}), owed {expected}")


async def _histories_hold_what_was_owed(rig: FaultRig) -> None:
    """Each job's history (what a gateway replays) holds its owed events, oldest first."""
    owed = rig.load.owed()
    for job in rig.load.jobs:
        raw = await rig.redis.lrange(JobKeys.in_family(rig.family, job).history, 0, -1)
        held = [(int(e["seq"]), e.get("stream_id")) for e in map(orjson.loads, raw)]
        expected = [(e.seq, e.entry_id) for e in owed.get(job, [])]
        if held != expected:
            rig.require(False, f"{job}'s history holds {held}, owed {expected}")
