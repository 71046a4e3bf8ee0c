"""A rolling upgrade from the release that judged every event in Lua, and the rollback to it.

The previous release (`PREVIOUS_RELEASE`, its `src/` taken with `git archive`) judged each
batch inside `apply_batch.lua`; this tree judges in `domain.settle`, holds job records under
the shard's fencing token and stores the writes with `store_batch.lua`, on the same keys and
fields. Both run in one consumer group here, on the test's own servers, with the documented
defaults (only the addresses, consumer names and loopback HTTP ports set, as in every fault
scenario): two workers and a gateway (router inside) of one release are replaced one at a
time by the other's while the producer keeps writing, malformed entries and retried seqs
included: the gateway first, then a worker stopped with SIGTERM, then the last one killed
while a batch it stored is on its way to Pub/Sub (a node lost mid-rollout), so the other
release takes over entries it judged. As soon as each is gone every job's last applied event
is appended again, as a producer retrying outside its idempotency window does, and an event
below every seq it wrote, as one delivered late: whichever router holds the shard next must
judge them a duplicate and stale from what was stored.

Chat answers go through the same rollout (all three stopped with SIGTERM), each answer's
last token written again as soon as a router is gone: every viewer, and a late one, must
end with the exact text of its answer, and so must its stored text (`ChatRig.conclude`).

Checked from the outside, as in every scenario (`FaultRig.conclude`: every owed event
published in order and seen once by the viewers, who move from a gateway of one release to
one of the other; states, dead letters, nothing pending), and besides: both releases' store
scripts ran; on Pub/Sub every owed event under one id, first published in seq order, nothing
else (a repeat only the same entry again); and each job's history, the list a gateway
replays, holds exactly its owed events in order.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from bench.baseline_source import baseline_source
from bench.router_process import REPOSITORY_ROOT

from eco_router.adapters.redis.keys import JobKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.testing import RedisServer
from tests.faults.chat import ChatRig, ChatScenario, ChatSizes
from tests.faults.conftest import OpenRig
from tests.faults.harness import FaultRig, Scenario, Sizes
from tests.integration.support import GROUP, WorkerProcess
from tests.tcp_relay import Mode, TcpRelay

pytestmark = pytest.mark.integration

# The last commit whose router judged in Lua (apply_batch.lua).
PREVIOUS_RELEASE = "f609f79"
# The script each release stores a batch with, as shipped in its package.
LUA = Path("eco_router/adapters/redis/lua")
PREVIOUS_SCRIPT, CURRENT_SCRIPT = "apply_batch.lua", "store_batch.lua"
# A router's SIGTERM drain (up to 8 s) and a loaded machine.
EXIT_TIMEOUT_S = 30.0
# The moments to replace the routers: these shares of the load's events applied.
REPLACE_AT = (0.1, 0.2, 0.3)

# Long enough (about 60 events a job, 0.3 s apart) to outlast the three replacements, the
# old gateway's shutdown (up to its 10 s for open streams, then its drain) included.
SIZES = Sizes("40x60", jobs=40, events=60, pace_s=0.3, malformed=0.02, duplicates=0.05, window=2)
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
# Chat answers long enough (about 20 s of tokens each) to outlast the three replacements.
CHAT_SIZES = ChatSizes("16x250", answers=16, tokens=250)
CHAT_UPGRADE = ChatScenario(
    20,
    "chat-rolling-upgrade",
    f"Chat answers while routers of {PREVIOUS_RELEASE} are replaced one at a time by this tree's",
    CHAT_SIZES,
)
CHAT_ROLLBACK = ChatScenario(
    21,
    "chat-rolling-rollback",
    f"Chat answers while this tree's routers are replaced one at a time by {PREVIOUS_RELEASE}'s",
    CHAT_SIZES,
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
        self,
        scenario: Scenario,
        open_rig: OpenRig,
        previous_release: Path,
        pubsub_server: RedisServer,
    ) -> None:
        before, after = (
            (previous_release, None) if scenario is UPGRADE else (None, previous_release)
        )
        async with TcpRelay(pubsub_server.port) as relay:
            rig = open_rig(scenario)
            (graceful,) = await rig.start(workers=1, release=before)
            # The last one's publishes go through a relay, to be caught with a batch stored.
            doomed = await rig.start_worker(before, pubsub_url=relay.url)
            await rig.start_load()
            retried = 0

            # The gateway first: the new one takes the address viewers connect to, then the
            # old one ends its streams and its viewers resume there with their Last-Event-ID.
            await rig.load.until_routed(REPLACE_AT[0])
            old_gateway = rig.gateway
            await rig.start_gateway(after)
            await asyncio.to_thread(old_gateway.stop)
            rig.require(old_gateway.exit_code == 0, f"old gateway exited {old_gateway.exit_code}")
            retried += await rig.load.retry_applied()

            await rig.load.until_routed(REPLACE_AT[1])
            graceful.terminate()
            code = await graceful.wait_exit(EXIT_TIMEOUT_S)
            rig.require(code == 0, f"{graceful.name} exited with {code} on SIGTERM")
            # Before any newer event: the first of the job the next holder judges.
            retried += await rig.load.retry_applied()
            await rig.start_worker(after)

            # The last one is lost mid-rollout (a node gone): a batch it stored is on its way
            # to Pub/Sub, so the other release's routers take entries over that it judged.
            await rig.load.until_routed(REPLACE_AT[2])
            relay.set_mode(Mode.FREEZE)
            caught = await _catch_stored_unpublished(rig, doomed)
            doomed.kill()
            # What it was publishing never arrives: the takeover must publish it.
            relay.set_mode(Mode.CUT)
            rig.recover_from("the last old router killed")
            applied_at_kill = round(rig.load.routed / rig.load.total_events, 2)
            rig.require(not rig.load.done, "the load ended before the last router was replaced")
            retried += await rig.load.retry_applied()
            await rig.start_worker(after)

            rig.figures.params |= {
                "previous_release": PREVIOUS_RELEASE,
                "retried_after_replacements": retried,
                "stored_unpublished_at_kill": len(caught),
                "applied_at_kill": applied_at_kill,
            }
            rig.require(bool(caught), f"{doomed.name} was never caught with a stored batch")

            await rig.settle(timeout_s=120.0)
            await _both_releases_stored_batches(rig, previous_release)
            _published_once_in_order(rig)
            await _histories_hold_what_was_owed(rig)
            rig.conclude()


class TestRollingUpgradeMidAnswer:
    @pytest.mark.parametrize("scenario", [CHAT_UPGRADE, CHAT_ROLLBACK], ids=["upgrade", "rollback"])
    async def test_every_viewer_ends_with_the_whole_text_across_the_rollout(
        self,
        scenario: ChatScenario,
        tmp_path: Path,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        previous_release: Path,
    ) -> None:
        before, after = (
            (previous_release, None) if scenario is CHAT_UPGRADE else (None, previous_release)
        )
        rig = ChatRig(
            tmp_path, scenario, streams_url=streams_server.url, pubsub_url=pubsub_server.url
        )
        try:
            workers = await rig.start(workers=2, release=before)
            await rig.start_load()

            await rig.load.until_written(REPLACE_AT[0])
            old_gateway = rig.gateway
            await rig.start_gateway(after)
            await asyncio.to_thread(old_gateway.stop)
            rig.require(old_gateway.exit_code == 0, f"old gateway exited {old_gateway.exit_code}")
            retried = await rig.load.retry_last_tokens()
            for worker, share in zip(workers, REPLACE_AT[1:], strict=True):
                await rig.load.until_written(share)
                worker.terminate()
                code = await worker.wait_exit(EXIT_TIMEOUT_S)
                rig.require(code == 0, f"{worker.name} exited with {code} on SIGTERM")
                # Before any newer token: the first of the job the next holder judges.
                retried += await rig.load.retry_last_tokens()
                await rig.start_worker(after)
            rig.recover_from("the last router replaced")
            rig.figures.params |= {
                "previous_release": PREVIOUS_RELEASE,
                "tokens_retried_after_replacements": retried,
                "written_when_the_last_was_replaced": round(
                    rig.load.tokens_written / rig.load.total_tokens, 2
                ),
            }
            rig.require(not rig.load.done, "the answers ended before the last router was replaced")

            await rig.settle()
            rig.conclude()
        finally:
            await rig.aclose()


async def _catch_stored_unpublished(
    rig: FaultRig, worker: WorkerProcess, timeout_s: float = 15.0
) -> list[tuple[str, int]]:
    """(job, seq) of the entries `worker` holds unacked whose events its store applied (the
    job's state reached them), once there are any; its publishes must be frozen."""
    deadline = time.monotonic() + timeout_s
    while True:
        held: list[tuple[str, int]] = []
        for stream in rig.family.streams:
            pending = await rig.redis.xpending_range(
                stream, GROUP, min="-", max="+", count=1000, consumername=worker.name
            )
            for item in pending:
                entry = rig.load.written.get((stream, item["message_id"].decode()))
                if entry is not None and entry.job_id is not None and entry.seq is not None:
                    held.append((entry.job_id, entry.seq))
        stored = [(job, seq) for job, seq in held if rig.load.applied.get(job, -1) >= seq]
        if stored or time.monotonic() > deadline:
            return stored
        await asyncio.sleep(0.02)


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
    """Every job's events on Pub/Sub: each owed event under one id, first published in seq
    order, nothing else. A repeat is the same entry published again (an entry redelivered
    after its router died is, with its id: viewers drop it), and is counted."""
    owed = rig.load.owed()
    repeats = 0
    for job in rig.load.jobs:
        ids: dict[int, str] = {}
        for message in rig.collector.messages:
            if message.payload["job_id"] != job:
                continue
            seq, entry_id = int(message.payload["seq"]), str(message.payload["stream_id"])
            if seq not in ids:
                ids[seq] = entry_id
                continue
            repeats += 1
            if ids[seq] != entry_id:
                rig.require(False, f"{job} seq {seq} published as {ids[seq]} and {entry_id}")
        expected = {e.seq: e.entry_id for e in owed.get(job, []) if e.seq is not None}
        if list(ids.items()) != list(expected.items()):
            rig.require(False, f"{job} published {list(ids.items())}, owed {expected}")
    rig.figures.params |= {"published_again_with_the_same_id": repeats}


async def _histories_hold_what_was_owed(rig: FaultRig) -> None:
    """Each job's history (what a gateway replays) holds its owed events, oldest first."""
    owed = rig.load.owed()
    for job in rig.load.jobs:
        raw = await rig.redis.lrange(JobKeys.in_family(rig.family, job).history, 0, -1)
        held = [(int(e["seq"]), e.get("stream_id")) for e in map(orjson.loads, raw)]
        expected = [(e.seq, e.entry_id) for e in owed.get(job, [])]
        if held != expected:
            rig.require(False, f"{job}'s history holds {held}, owed {expected}")
