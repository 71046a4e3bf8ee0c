"""The same random batches through the in-memory store (`domain.settle` and its writes) and
the Redis store on a real Redis give the same verdicts, stamps, states, histories and texts,
whether the Redis store holds its records, evicts them (holding one job, or none) or starts
afresh (a restart, a take-over) and reads them back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.adapters.redis.keys import GroupKeys
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.application.port_values import EncodedEvent
from eco_router.application.ports import StateStore
from eco_router.domain.verdict import in_judging_order
from eco_router.testing import RedisServer
from tests.contracts.factories import FAMILIES, GROUP, encoded

SCAN_SHARD = FAMILIES[0].streams[0]
CHAT_SHARD = FAMILIES[1].streams[0]
SHARDS = (SCAN_SHARD, CHAT_SHARD)
JOBS = (("scan", SCAN_SHARD), ("chat", CHAT_SHARD))
# Entries are numbered `ENTRY_MS-n`; the streams hold the first few (some deleted since), the
# others were never held: a marker naming one was written from a lost write.
ENTRY_MS = 1000
ENTRIES = 6
STAGES = ("queued", "scanning", "writing")
LIFECYCLE = ("cancel_requested", "input_received", "needs_input")


@dataclass(frozen=True)
class Shape:
    """A run's bounds and its streams: how many entries each holds, which were deleted."""

    history_size: int
    history_max_bytes: int
    text_max_bytes: int
    held: int
    deleted: frozenset[int]
    held_jobs: int


def _entry(n: int) -> str:
    return f"{ENTRY_MS}-{n}"


@st.composite
def events(draw: st.DrawFn) -> EncodedEvent:
    domain, stream = draw(st.sampled_from(JOBS))
    entry = _entry(draw(st.integers(0, ENTRIES - 1)))
    fields = {"domain": domain, "stream": stream, "stream_id": entry, "job_id": "job-1"}
    kind = draw(st.sampled_from(("stage", "stage", "end", "token", "token", "token", "life")))
    if kind == "token":
        extra = {"content": draw(st.sampled_from(("a", "bc", "é", "ab€", "")))}
        node = draw(st.sampled_from((None, "n1", "n2")))
        if node is not None:
            extra["node"] = node
        return encoded(
            **fields,
            seq=draw(st.integers(1001, 1006)),
            stage="token",
            status="running",
            attempt=draw(st.integers(0, 2)),
            extra=extra,
        )
    if kind == "life":
        return encoded(
            **fields,
            seq=draw(st.integers(1, 2)),
            stage=draw(st.sampled_from(LIFECYCLE)),
            status="running",
        )
    if kind == "end":
        stage, status = draw(st.sampled_from((("done", "done"), ("writing", "failed"))))
        return encoded(**fields, seq=draw(st.integers(1, 5)), stage=stage, status=status)
    # Seq 0, a job's first event: a store that holds no record takes the job for new.
    return encoded(
        **fields, seq=draw(st.integers(0, 5)), stage=draw(st.sampled_from(STAGES)), status="running"
    )


shapes = st.builds(
    Shape,
    history_size=st.integers(1, 4),
    history_max_bytes=st.sampled_from((300, 1 << 20)),
    text_max_bytes=st.sampled_from((4, 1 << 20)),
    held=st.integers(0, ENTRIES),
    deleted=st.frozensets(st.integers(0, ENTRIES - 1), max_size=3),
    held_jobs=st.sampled_from((0, 1, 1000)),
)
# Each batch: its events, whether the scan shard's token given is a stale one (fenced), and
# whether the Redis store is a new one (holding nothing) from this batch on.
batches = st.lists(
    st.tuples(st.lists(events(), min_size=1, max_size=6), st.booleans(), st.booleans()),
    min_size=1,
    max_size=5,
)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


class TestTheStoresSettleAlike:
    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(shape=shapes, runs=batches)
    def test_the_same_batches_leave_both_stores_the_same(
        self,
        server: RedisServer,
        shape: Shape,
        runs: list[tuple[list[EncodedEvent], bool, bool]],
    ) -> None:
        asyncio.run(_compare(server.url, shape, runs))


async def _compare(
    url: str, shape: Shape, runs: list[tuple[list[EncodedEvent], bool, bool]]
) -> None:
    redis = Redis.from_url(url)
    try:
        # The keys of the example before (the server is this module's own).
        keys = [key async for key in redis.scan_iter()]
        if keys:
            await redis.delete(*keys)
        memory, in_redis = await _stores(redis, shape)
        # Every event once more at the end: what each marker names shows in the verdicts.
        everything = [e for batch, _, _ in runs for e in batch]
        for n, (batch, stale_token, afresh) in enumerate([*runs, (everything, False, True)]):
            if afresh:
                in_redis = _redis_store(redis, shape)
            ordered = in_judging_order([e.event for e in batch])
            by_event = {id(e.event): e for e in batch}
            items = [by_event[id(event)] for event in ordered]
            fence = {SCAN_SHARD: 0 if stale_token else 1, CHAT_SHARD: 1}
            kept = await memory.apply(items, fence)
            stored = await in_redis.apply(items, fence)
            assert kept.judgements == stored.judgements, f"batch {n}"
            assert kept.stamps == stored.stamps, f"batch {n}"
            assert kept.fenced == stored.fenced
            for domain, _ in JOBS:
                assert await memory.view(domain, "job-1") == await in_redis.view(domain, "job-1"), (
                    f"batch {n}, {domain}"
                )
                assert await memory.text(domain, "job-1") == await in_redis.text(domain, "job-1"), (
                    f"batch {n}, {domain}"
                )
    finally:
        await redis.aclose()


async def _stores(redis: Redis, shape: Shape) -> tuple[StateStore, StateStore]:
    """Both stores over streams holding the same entries, each shard held with token 1."""
    clock = ManualClock(now_ms=ENTRY_MS)
    streams = InMemoryStreams(clock)
    for stream in SHARDS:
        for n in range(shape.held):
            assert streams.xadd(stream, {"n": "1"}) == _entry(n)
            await redis.xadd(stream, {"n": "1"}, id=_entry(n))
        for n in shape.deleted:
            if n < shape.held:
                streams.delete_entry(stream, _entry(n))
                await redis.xdel(stream, _entry(n))
        streams.lease_table(GROUP).epochs[stream] = 1
        await redis.set(GroupKeys(GROUP).epoch(stream), 1)
    limits = {
        "history_size": shape.history_size,
        "history_max_bytes": shape.history_max_bytes,
        "text_max_bytes": shape.text_max_bytes,
    }
    memory = InMemoryStateStore(
        clock=clock,
        streams=streams,
        group=GROUP,
        state_ttl_s=3600,
        markers_ttl_s=7200,
        **limits,
    )
    return memory, _redis_store(redis, shape)


def _redis_store(redis: Redis, shape: Shape) -> RedisLuaStateStore:
    return RedisLuaStateStore(
        redis,
        families=FAMILIES,
        group=GROUP,
        state_ttl_s=3600,
        markers_ttl_s=7200,
        history_size=shape.history_size,
        history_max_bytes=shape.history_max_bytes,
        text_max_bytes=shape.text_max_bytes,
        held_jobs=shape.held_jobs,
    )
