"""Chat answers under faults, against real processes: a router killed mid-answer, and the
Pub/Sub Redis restarted mid-answer.

Answers are written token by token between their stage events while a viewer watches each
(`tests/faults/chat.py`); a late viewer opens each job once all are over. Every viewer must
end with exactly the text of its answer's last attempt, `done` once, and nothing may be left
pending or dead-lettered; the figures go to `tests/faults/results/<scenario>.json` like every
scenario's.

Settings: every router runs with the documented defaults, only the servers' addresses, the
consumer names and the loopback HTTP ports set (`harness.router_env`): the lease TTL (4 s),
the reclaimer, the blocking read, the SSE keepalive (15 s) and re-check (60 s) and the text
limit are the defaults, and the default `EVENT_ROUTER_STREAMS` serves the chat shards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from eco_router.testing import RedisServer
from tests.faults.chat import CHAT, ChatRig, ChatScenario, ChatSizes
from tests.faults.harness import LEASE_TTL_S, until
from tests.integration.support import WorkerProcess
from tests.tcp_relay import Mode, TcpRelay

pytestmark = pytest.mark.integration

# The moment of the fault: this share of the answers' tokens written.
MID_ANSWER = 0.3
PUBSUB_DOWN_S = 5.0
# A router's shards pass to the others once its lease lapses; slack for a loaded machine.
TAKEOVER_BOUND_S = LEASE_TTL_S + 4.0
# How long the doomed router's publish is held once it holds entries (far less than its
# lease): the answers go on meanwhile.
PILE_UP_S = 0.3
# Long enough to outlast the fault and its recovery: ~10 s of tokens per answer.
SIZES = ChatSizes("24x120", answers=24, tokens=120)

OpenChatRig = Callable[[ChatScenario], ChatRig]


@pytest.fixture
async def open_chat_rig(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> AsyncIterator[OpenChatRig]:
    """Builds a scenario's rig on the test's servers; what it started is stopped afterwards."""
    rigs: list[ChatRig] = []

    def build(scenario: ChatScenario) -> ChatRig:
        rig = ChatRig(
            tmp_path, scenario, streams_url=streams_server.url, pubsub_url=pubsub_server.url
        )
        rigs.append(rig)
        return rig

    yield build
    for rig in rigs:
        await rig.aclose()


def chat_scenario(number: int, slug: str, title: str, *sizes: ChatSizes) -> pytest.MarkDecorator:
    cases = [ChatScenario(number, slug, title, each) for each in sizes]
    return pytest.mark.parametrize("scenario", cases, ids=lambda case: case.sizes.name)


class TestRouterKilledMidAnswer:
    # The kill lands where it costs the most: the router has applied a batch with tokens in
    # it (they are in the job's text) and its publish of them is on its way. Each worker
    # dials Pub/Sub through a relay of its own; the doomed one's is frozen first, so the
    # batch stays there, and dies with the router. Its successor takes the entries over, finds the
    # tokens in the text (duplicates: not published again), and the viewers get them in a
    # token_recovery when the answer's next event shows them what they missed.
    @chat_scenario(
        16,
        "chat-router-sigkill",
        "A router killed with SIGKILL mid-answer, tokens it applied on their way to Pub/Sub; "
        "another takes its chat shards over once its lease lapses",
        SIZES,
    )
    async def test_every_viewer_ends_with_the_whole_text_after_a_router_dies_mid_answer(
        self, scenario: ChatScenario, open_chat_rig: OpenChatRig, pubsub_server: RedisServer
    ) -> None:
        async with (
            TcpRelay(pubsub_server.port) as first,
            TcpRelay(pubsub_server.port) as second,
        ):
            rig = open_chat_rig(scenario)
            workers = await rig.start(workers=2, pubsub_urls=[first.url, second.url])
            relays = dict(zip((w.name for w in workers), (first, second), strict=True))
            shared = await until(lambda: _chat_shards_shared(rig, set(relays)), timeout_s=15)
            rig.require(shared, "no worker ever held a chat shard")
            await rig.start_load()
            await rig.load.until_written(MID_ANSWER)

            owners = await rig.chat_owners()
            doomed = max(workers, key=lambda w: sum(o == w.name for o in owners.values()))
            doomed_shards = sorted(s for s, o in owners.items() if o == doomed.name)
            caught = await _catch_publishing_tokens(rig, doomed, relays[doomed.name])
            held = await rig.pending_of(doomed.name)
            doomed.kill()
            rig.recover_from("the kill")
            rig.figures.params |= {
                "chat_shards_of_killed_router": len(doomed_shards),
                "held_by_killed_router": held,
                "tokens_in_flight_at_kill": len(caught),
            }
            rig.require(bool(caught), "the killed router was never caught publishing tokens")
            rig.require(not rig.load.done, "the answers ended before the kill")

            await rig.settle()
            # Applied, and in no publish since: the viewers got them in a token_recovery.
            never = set(caught) - rig.published_tokens()
            rig.figures.params |= {"tokens_in_flight_never_published": len(never)}
            rig.require(bool(never), f"the tokens in flight at the kill were published: {caught}")
            owners = await rig.chat_owners()
            rig.require(held > 0, "the killed router held no chat entries: nothing was taken over")
            rig.require(
                len(owners) == len(CHAT.streams) and doomed.name not in owners.values(),
                f"chat shards not all taken over: {owners}",
            )
            rig.require(
                all(p.exit_code is None for p in rig.routers if p is not doomed),
                "a surviving router exited",
            )
            rig.require(
                rig.figures.recovery_s <= TAKEOVER_BOUND_S,
                f"recovered {rig.figures.recovery_s} s after the kill (bound {TAKEOVER_BOUND_S} s)",
            )
            rig.conclude()


class TestPubSubRestartMidAnswer:
    @chat_scenario(
        17,
        "chat-pubsub-restart",
        f"The Pub/Sub Redis stopped for {PUBSUB_DOWN_S:g} s mid-answer, then started again",
        SIZES,
    )
    async def test_every_viewer_ends_with_the_whole_text_after_pubsub_restarts_mid_answer(
        self, scenario: ChatScenario, open_chat_rig: OpenChatRig, pubsub_server: RedisServer
    ) -> None:
        rig = open_chat_rig(scenario)
        await rig.start(workers=2)
        await rig.start_load()
        await rig.load.until_written(MID_ANSWER)

        await asyncio.to_thread(pubsub_server.stop)
        written_before = rig.load.tokens_written
        await asyncio.sleep(PUBSUB_DOWN_S)
        written_while_down = rig.load.tokens_written - written_before
        await asyncio.to_thread(pubsub_server.start)
        rig.recover_from("the restart")
        rig.figures.params |= {
            "pubsub_down_s": PUBSUB_DOWN_S,
            "tokens_written_while_down": written_while_down,
        }
        rig.require(not rig.load.done, "the answers ended before Pub/Sub came back")

        await rig.settle()
        failed = await rig.metric_sum("event_router_publish_errors_total")
        rig.figures.params |= {"publishes_failed": int(failed)}
        rig.require(failed > 0, "no publish failed: the outage was not felt")
        rig.require(written_while_down > 0, "no token was written while Pub/Sub was down")
        rig.require(all(p.exit_code is None for p in rig.routers), "a router exited")
        rig.conclude()


async def _chat_shards_shared(rig: ChatRig, workers: set[str]) -> bool:
    """Every chat shard leased, and a worker holding one."""
    owners = await rig.chat_owners()
    return len(owners) == len(CHAT.streams) and bool(workers & set(owners.values()))


async def _catch_publishing_tokens(
    rig: ChatRig, router: WorkerProcess, relay: TcpRelay, tries: int = 5
) -> list[tuple[str, int, int]]:
    """Freeze `router`'s Pub/Sub connection until it holds tokens it has read and applied and
    not published (it is stuck in their publish), for `PILE_UP_S` more; those tokens (none:
    never caught). A batch without such a token of an answer's last attempt (one a retry
    will replace) is let through, and the next one tried."""
    for _ in range(tries):
        relay.set_mode(Mode.FREEZE)
        if await until(lambda: _holding(rig, router), timeout_s=10, every_s=0.01):
            await asyncio.sleep(PILE_UP_S)
            applied = await rig.applied_tokens(await rig.pending_tokens_of(router.name))
            # Published and not yet acked (its ack rides on the next read) does not count.
            tokens = [t for t in applied if t not in rig.published_tokens()]
            if tokens:
                return tokens
        relay.set_mode(Mode.PASS)
        await asyncio.sleep(0.1)
    return []


async def _holding(rig: ChatRig, router: WorkerProcess) -> bool:
    return await rig.pending_of(router.name) > 0
