"""The Redis state store on a real Redis: the writes it stores for each verdict, the keys and
their TTLs, and every branch of `store_batch.lua`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.adapters.redis.router.store_flags import (
    HISTORY_RENEW,
    MARKERS_RENEW,
    STATE_LAST,
    STATE_OWN,
    STATE_RENEW,
    TEXT_APPEND,
    TEXT_FORGET,
    TEXT_KEYS,
    TEXT_RENEW,
    TEXT_SET,
)
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.port_values import Applied, EncodedEvent, ReadStart
from eco_router.domain.text import stamp, stamped
from eco_router.domain.verdict import (
    DUPLICATE,
    NEW_APPLY,
    NEW_IN_PLACE_OF_GONE,
    NEW_REPUBLISH,
    NEW_RESTART,
    STALE,
    STALE_AFTER_END,
    TEXT_FILLED,
    TEXT_FULL,
    Judgement,
    Verdict,
)
from eco_router.entrypoints.settings import Settings
from tests.contracts.factories import FAMILIES, encoded, entry_id, wait_until

STATE_TTL_S = 100
MARKERS_TTL_S = 200
# The store renews the TTLs of a job's history, text and markers at most this often (a tenth
# of the state TTL, at most a minute), and keeps them that much longer.
RENEW_EVERY_S = 10
HISTORY_SIZE = 3
HISTORY_MAX_BYTES = 1 << 20
TEXT_MAX_BYTES = 1 << 20
# The text cap of the `small_text` store.
SMALL_TEXT = 10
JOB = JobKeys.of("scan", "job-1")
CHAT_JOB = JobKeys.of("chat", "job-1")
MAX_SEQ = 2**53 - 1


SHARD = "scan:events:0"
CHAT_SHARD = "chat:events:0"
GROUP = "router"
EPOCH = GroupKeys(GROUP).epoch(SHARD)
CHAT_EPOCH = GroupKeys(GROUP).epoch(CHAT_SHARD)


async def make_store(
    redis: Redis,
    *,
    state_ttl_s: int = STATE_TTL_S,
    markers_ttl_s: int = MARKERS_TTL_S,
    history_size: int = HISTORY_SIZE,
    history_max_bytes: int = HISTORY_MAX_BYTES,
    text_max_bytes: int = TEXT_MAX_BYTES,
    held_jobs: int = 1000,
) -> RedisLuaStateStore:
    """A store holding both shards with token 1."""
    await redis.set(EPOCH, 1)
    await redis.set(CHAT_EPOCH, 1)
    return RedisLuaStateStore(
        redis,
        families=FAMILIES,
        group=GROUP,
        state_ttl_s=state_ttl_s,
        markers_ttl_s=markers_ttl_s,
        history_size=history_size,
        history_max_bytes=history_max_bytes,
        text_max_bytes=text_max_bytes,
        held_jobs=held_jobs,
    )


@pytest.fixture
async def store(streams_redis: Redis) -> RedisLuaStateStore:
    return await make_store(streams_redis)


@pytest.fixture
async def small_text(streams_redis: Redis) -> RedisLuaStateStore:
    """A store whose texts hold `SMALL_TEXT` bytes."""
    return await make_store(streams_redis, text_max_bytes=SMALL_TEXT)


async def apply_stamped(store: RedisLuaStateStore, events: Sequence[EncodedEvent]) -> Applied:
    """Apply as the holder of both shards (fencing token 1)."""
    applied = await store.apply(events, {SHARD: 1, CHAT_SHARD: 1})
    assert applied.fenced == frozenset()
    return applied


async def apply(
    store: RedisLuaStateStore, events: Sequence[EncodedEvent]
) -> list[Judgement | None]:
    return (await apply_stamped(store, events)).judgements


async def markers_renewed_now(redis: Redis, job: JobKeys = JOB) -> dict[bytes, bytes]:
    """The job's markers but "renewed", which must be the server's time (within a second)."""
    markers = await redis.hgetall(job.markers)
    now_s, _ = await redis.time()
    assert now_s - 1 <= int(markers.pop(b"renewed")) <= now_s
    return dict(markers)


async def hold(redis: Redis, *numbers: int) -> None:
    """Put entries `entry_id(n)` in the shard, as the entries that applied their seqs are
    (a duplicate is one only while the stream holds the entry that applied its seq)."""
    async with redis.pipeline(transaction=False) as pipe:
        for n in numbers:
            pipe.xadd(SHARD, {"n": str(n)}, id=entry_id(n))
        await pipe.execute()


def raw(payload: bytes, **overrides: object) -> EncodedEvent:
    """An event carrying `payload` as is, whatever the encoder would have made of it."""
    return EncodedEvent(encoded(**overrides).event, payload)


def kept(item: EncodedEvent, prev: int | None = None) -> bytes:
    """`item`'s payload as stored for a job of stage events only (its event id is its seq),
    after the job's event `prev`."""
    return stamped(item.payload, stamp(item.event.seq, prev))


def kept_in_turn(items: Sequence[EncodedEvent], prev: int | None = None) -> list[bytes]:
    """`kept` for events applied one after the other, the first after `prev`."""
    seqs = [prev, *(item.event.seq for item in items)]
    return [kept(item, before) for item, before in zip(items, seqs, strict=False)]


def token(
    seq: int, content: str, *, attempt: int = 0, node: str | None = None, n: int | None = None
) -> EncodedEvent:
    """Token `seq` of chat job-1, from entry `entry_id(n)` (`n` defaults to `seq`)."""
    extra = {"content": content} | ({"node": node} if node is not None else {})
    return encoded(
        domain="chat",
        stream=CHAT_SHARD,
        stream_id=entry_id(seq if n is None else n),
        stage="token",
        seq=seq,
        attempt=attempt,
        extra=extra,
    )


def chat(seq: int, **overrides: object) -> EncodedEvent:
    """Stage event `seq` of chat job-1, from entry `entry_id(seq)` unless overridden."""
    fields: dict[str, object] = {"stream_id": entry_id(seq)} | overrides
    return encoded(domain="chat", stream=CHAT_SHARD, seq=seq, **fields)


def sha1(text: bytes) -> str:
    return hashlib.sha1(text, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Part:
    """One job's part of a store call, as `store_batch.lua` takes it."""

    shard: int
    job: JobKeys
    flags: int = 0
    appended: Sequence[bytes] = ()
    state: bytes | None = None
    text: bytes | None = None
    marks: Sequence[bytes | str | int] = ()
    text_fields: Sequence[bytes | str | int] = ()
    dropped: int = 0


# The state's, the history's and the markers' TTLs `store_parts` gives.
TTLS = (50, 70, 90)


async def store_parts(
    redis: Redis,
    parts: Sequence[Part],
    *,
    shards: Sequence[tuple[str, str]] = ((SHARD, "1"), (CHAT_SHARD, "1")),
    absent: Sequence[str] = (),
    held: Sequence[tuple[int, str]] = (),
) -> list[list[Any]]:
    """One call of `store_batch.lua` as the holder of `shards` (stream, token and read to
    check), assuming the keys `absent` absent and the (shard, entry) pairs `held` held. Its
    fenced shards, gap shards and the indices of the keys assumed absent that exist; and,
    when `held` names any, the entries assumed held that are not."""
    script = redis.register_script(load_lua("store_batch.lua"))
    keys = [GroupKeys(GROUP).epoch(stream) for stream, _ in shards]
    keys += [stream for stream, _ in shards]
    values: list[bytes | str | int] = []
    for part in parts:
        job = part.job
        keys += [job.state, job.history, job.markers]
        if part.flags & TEXT_KEYS:
            keys += [job.text_state, job.text]
        values += [part.shard, part.flags, len(part.appended), len(part.marks)]
        values += [len(part.text_fields), part.dropped, *part.appended]
        values += [v for v in (part.state, part.text) if v is not None]
        values += [*part.marks, *part.text_fields]
    checked = []
    for key in absent:
        keys.append(key)
        checked.append(str(len(keys)))
    entries = " ".join(f"{shard} {entry}" for shard, entry in held)
    args = [GROUP, len(shards), *(token for _, token in shards), " ".join(checked), entries]
    fenced, gaps, (seconds, _), present, missing = await script(
        keys=keys, args=[*args, *TTLS, len(parts), *values]
    )
    now_s, _ = await redis.time()
    assert now_s - 1 <= int(seconds) <= now_s, "the third value is the server's time"
    return [fenced, gaps, present, missing] if held else [fenced, gaps, present]


class TestStoreScript:
    """`store_batch.lua`: the fence and the read order checked, then each job's writes as its
    flags and counts say."""

    async def test_the_writes_of_a_fenced_shard_are_left_out_and_the_others_stored(
        self, streams_redis: Redis
    ) -> None:
        await streams_redis.set(EPOCH, 2)
        await streams_redis.set(CHAT_EPOCH, 1)

        reply = await store_parts(
            streams_redis,
            [
                Part(1, JOB, STATE_OWN, state=b"fenced"),
                Part(2, CHAT_JOB, appended=[b"a", b"b"], marks=["last", 2]),
            ],
        )

        assert reply == [[1], [], []]
        assert await streams_redis.exists(JOB.state) == 0
        assert await streams_redis.lrange(CHAT_JOB.history, 0, -1) == [b"a", b"b"]
        assert await streams_redis.hget(CHAT_JOB.markers, "last") == b"2"

    async def test_a_shard_without_an_epoch_holds_no_token(self, streams_redis: Redis) -> None:
        reply = await store_parts(
            streams_redis, [Part(1, JOB, STATE_OWN, state=b"x")], shards=[(SHARD, "1")]
        )

        assert reply == [[1], [], []]
        assert await streams_redis.exists(JOB.state) == 0

    async def test_the_writes_of_a_shard_whose_read_came_after_another_consumers_are_left_out(
        self, streams_redis: Redis
    ) -> None:
        await streams_redis.set(EPOCH, 1)
        await streams_redis.xgroup_create(SHARD, GROUP, id="0", mkstream=True)
        taken = await streams_redis.xadd(SHARD, {"n": "1"})
        await streams_redis.xreadgroup(GROUP, "another", {SHARD: ">"}, count=1)
        first = (await streams_redis.xadd(SHARD, {"n": "2"})).decode()
        await streams_redis.xreadgroup(GROUP, "me", {SHARD: ">"}, count=1)
        parts = [Part(1, JOB, STATE_OWN, state=b"x")]

        gap = await store_parts(streams_redis, parts, shards=[(SHARD, f"1 (0-0 {first} me")])
        assert (gap, await streams_redis.exists(JOB.state)) == ([[], [1], []], 0)

        after = f"1 ({taken.decode()} {first} me"
        in_order = await store_parts(streams_redis, parts, shards=[(SHARD, after)])
        assert (in_order, await streams_redis.get(JOB.state)) == ([[], [], []], b"x")

    async def test_nothing_is_written_when_a_key_assumed_absent_exists(
        self, streams_redis: Redis
    ) -> None:
        await streams_redis.set(EPOCH, 1)
        other = JobKeys.of("scan", "job-2")
        await streams_redis.hset(other.markers, "last", 4)
        parts = [Part(1, JOB, STATE_OWN, state=b"x", marks=["last", 0])]

        reply = await store_parts(
            streams_redis, parts, shards=[(SHARD, "1")], absent=[JOB.markers, other.markers]
        )

        # The keys: the epoch, the stream, the job's three, then the two checked.
        assert reply == [[], [], [7]]
        assert await streams_redis.exists(JOB.state, JOB.markers) == 0

    async def test_nothing_is_written_when_an_entry_assumed_held_is_not(
        self, streams_redis: Redis
    ) -> None:
        await streams_redis.set(EPOCH, 1)
        await hold(streams_redis, 1)
        parts = [Part(1, JOB, STATE_OWN, state=b"x")]

        reply = await store_parts(
            streams_redis, parts, shards=[(SHARD, "1")], held=[(1, entry_id(1)), (1, entry_id(2))]
        )

        assert reply == [[], [], [], [f"1 {entry_id(2)}".encode()]]
        assert await streams_redis.exists(JOB.state) == 0
        assert await store_parts(
            streams_redis, parts, shards=[(SHARD, "1")], held=[(1, entry_id(1))]
        ) == [[], [], [], []]
        assert await streams_redis.get(JOB.state) == b"x"

    async def test_each_write_takes_its_own_values_in_order(self, streams_redis: Redis) -> None:
        await streams_redis.set(EPOCH, 1)
        await streams_redis.hset(JOB.markers, "a", 0)
        part = Part(
            1,
            JOB,
            STATE_OWN | HISTORY_RENEW | MARKERS_RENEW,
            appended=[b"1", b"2", b"3"],
            state=b"s",
            marks=["a", 1, "b", 2],
            dropped=1,
        )

        await store_parts(streams_redis, [part], shards=[(SHARD, "1")])

        assert await streams_redis.lrange(JOB.history, 0, -1) == [b"2", b"3"]
        assert await streams_redis.get(JOB.state) == b"s"
        assert await streams_redis.hgetall(JOB.markers) == {b"a": b"1", b"b": b"2"}
        state_ttl, history_ttl, markers_ttl = TTLS
        assert 0 < await streams_redis.ttl(JOB.state) <= state_ttl
        assert state_ttl < await streams_redis.ttl(JOB.history) <= history_ttl
        assert history_ttl < await streams_redis.ttl(JOB.markers) <= markers_ttl

    async def test_the_state_set_is_the_last_payload_appended_sent_once(
        self, streams_redis: Redis
    ) -> None:
        await streams_redis.set(EPOCH, 1)

        await store_parts(
            streams_redis,
            [Part(1, JOB, STATE_LAST, appended=[b"first", b"payload"])],
            shards=[(SHARD, "1")],
        )

        assert await streams_redis.lrange(JOB.history, 0, -1) == [b"first", b"payload"]
        assert await streams_redis.get(JOB.state) == b"payload"
        assert 0 < await streams_redis.ttl(JOB.state) <= TTLS[0]
        assert await streams_redis.ttl(JOB.history) == -1, "not renewed unless flagged"

    async def test_a_lifecycle_event_alone_renews_the_state_as_long_as_the_history(
        self, streams_redis: Redis
    ) -> None:
        await streams_redis.set(EPOCH, 1)
        await streams_redis.set(JOB.state, b"kept")

        await store_parts(
            streams_redis,
            [Part(1, JOB, STATE_RENEW | HISTORY_RENEW, appended=[b"cancelled"])],
            shards=[(SHARD, "1")],
        )

        assert await streams_redis.get(JOB.state) == b"kept"
        assert TTLS[0] < await streams_redis.ttl(JOB.state) <= TTLS[1]

    async def test_the_text_is_set_appended_to_forgotten_and_renewed_as_flagged(
        self, streams_redis: Redis
    ) -> None:
        await streams_redis.set(CHAT_EPOCH, 1)
        shards = [(CHAT_SHARD, "1")]
        fields = ["attempt", 0, "id", 7, "entry", "1-0"]
        text = TEXT_KEYS | TEXT_SET | TEXT_RENEW

        await store_parts(
            streams_redis, [Part(1, CHAT_JOB, text, text=b"ab", text_fields=fields)], shards=shards
        )
        await store_parts(
            streams_redis,
            [Part(1, CHAT_JOB, TEXT_KEYS | TEXT_APPEND | TEXT_FORGET, text=b"c")],
            shards=shards,
        )

        assert await streams_redis.get(CHAT_JOB.text) == b"abc"
        assert await streams_redis.hgetall(CHAT_JOB.text_state) == {b"attempt": b"0"}
        assert TTLS[0] < await streams_redis.ttl(CHAT_JOB.text) <= TTLS[1]
        assert TTLS[0] < await streams_redis.ttl(CHAT_JOB.text_state) <= TTLS[1]

    async def test_thousands_of_values_are_written_in_parts(self, streams_redis: Redis) -> None:
        await streams_redis.set(EPOCH, 1)
        payloads = [str(n).encode() for n in range(2500)]
        marks = [f"m{n}" if n % 2 == 0 else n for n in range(3002)]

        await store_parts(
            streams_redis,
            [
                Part(1, JOB, appended=payloads, marks=marks),
                Part(1, CHAT_JOB, STATE_OWN, state=b"s"),
            ],
            shards=[(SHARD, "1")],
        )

        assert await streams_redis.lrange(JOB.history, 0, -1) == payloads
        assert await streams_redis.hlen(JOB.markers) == 1501
        assert await streams_redis.get(CHAT_JOB.state) == b"s"

    def test_the_script_is_at_most_150_lines(self) -> None:
        assert len(load_lua("store_batch.lua").splitlines()) <= 150


class TestBranches:
    """What the store writes for each verdict."""

    async def test_code_0_applies_state_history_and_markers(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        event = encoded(seq=7, stream_id=entry_id(7))

        applied = await apply_stamped(store, [event])

        assert (applied.judgements, applied.stamps) == ([NEW_APPLY], [b'"event_id":7,'])
        assert await streams_redis.get(JOB.state) == kept(event)
        assert await streams_redis.lrange(JOB.history, 0, -1) == [kept(event)]
        assert await markers_renewed_now(streams_redis) == {
            b"7": entry_id(7).encode() + b' "event_id":7,',
            b"last": b"7",
            b"last_id": b"7",
            b"history_bytes": str(len(kept(event))).encode(),
            b"sizes": str(len(kept(event))).encode(),
        }

    async def test_code_1_republishes_without_writing(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        event = encoded(seq=1, stream_id=entry_id(1))
        await apply(store, [event])
        before = await _snapshot(streams_redis)

        assert await apply(store, [event]) == [NEW_REPUBLISH]

        assert await _snapshot(streams_redis) == before

    async def test_code_1_gives_the_stamp_of_the_first_time_text_check_included(
        self, store: RedisLuaStateStore
    ) -> None:
        done = chat(2, stage="done", status="done")
        first = await apply_stamped(store, [token(1001, "Hi"), done])
        await apply(store, [token(1002, " there")])

        again = await apply_stamped(store, [done])

        assert again.judgements == [NEW_REPUBLISH]
        assert again.stamps == [first.stamps[1]]
        assert first.stamps[1] == (
            b'"event_id":1002,"prev_event_id":1001,'
            b'"text_check":{"bytes":2,"sha1":"%s","truncated":false},' % sha1(b"Hi").encode()
        )

    async def test_code_2_is_a_duplicate_and_writes_nothing(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await hold(streams_redis, 1)
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        before = await _snapshot(streams_redis)

        applied = await apply_stamped(store, [encoded(seq=1, stream_id=entry_id(2), stage="copy")])

        assert (applied.judgements, applied.stamps) == ([DUPLICATE], [None])
        assert await _snapshot(streams_redis) == before

    @pytest.mark.parametrize("removal", ["XDEL", "XTRIM"])
    async def test_code_2_also_when_the_entry_that_applied_the_seq_was_deleted_or_trimmed_since(
        self, store: RedisLuaStateStore, streams_redis: Redis, removal: str
    ) -> None:
        # Published (or acked as gone) before it was removed: nothing is owed any more.
        await hold(streams_redis, 1, 2)
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        if removal == "XDEL":
            await streams_redis.xdel(SHARD, entry_id(1))
        else:
            await streams_redis.xtrim(SHARD, maxlen=1, approximate=False)

        judgements = await apply(store, [encoded(seq=1, stream_id=entry_id(3), stage="copy")])

        assert judgements == [DUPLICATE]

    async def test_code_5_publishes_in_place_of_an_entry_the_stream_lost_and_takes_its_marker(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await hold(streams_redis, 2)
        # entry_id(3) was never in the stream (nor deleted, nor trimmed): lost, as with a
        # demoted master whose entry was read before the failover.
        applied = encoded(seq=1, stream_id=entry_id(3))
        await apply(store, [applied])
        await hold(streams_redis, 4)
        before = await streams_redis.hgetall(JOB.markers)

        in_place = await apply_stamped(store, [encoded(seq=1, stream_id=entry_id(4), stage="copy")])

        # It is published as the lost one would have been, with its stamp.
        assert (in_place.judgements, in_place.stamps) == (
            [NEW_IN_PLACE_OF_GONE],
            [b'"event_id":1,'],
        )
        assert await streams_redis.hgetall(JOB.markers) == before | {
            b"1": entry_id(4).encode() + b' "event_id":1,'
        }
        assert await streams_redis.get(JOB.state) == kept(applied)
        assert await streams_redis.lrange(JOB.history, 0, -1) == [kept(applied)]
        assert await apply(store, [encoded(seq=1, stream_id=entry_id(5))]) == [DUPLICATE]

    async def test_code_3_is_stale_and_writes_nothing(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=5, stream_id=entry_id(5))])
        before = await _snapshot(streams_redis)

        applied = await apply_stamped(store, [encoded(seq=3, stream_id=entry_id(3), stage="late")])

        assert (applied.judgements, applied.stamps) == ([STALE], [None])
        assert await _snapshot(streams_redis) == before

    async def test_code_3_also_covers_a_seq_equal_to_the_last_one_without_its_marker(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        applied = encoded(seq=5, stream_id=entry_id(5))
        await apply(store, [applied])
        # Only "last" is left: the equal seq cannot be told apart from a replay, so it is stale.
        await streams_redis.hdel(JOB.markers, "5")
        # A router that holds no record of the job reads it as the keys have it.
        loading = await make_store(streams_redis)

        judgements = await apply(loading, [encoded(seq=5, stream_id=entry_id(6), stage="copy")])

        assert judgements == [STALE]
        assert await streams_redis.get(JOB.state) == kept(applied)

    async def test_the_largest_allowed_seq_is_compared_and_stored_exactly(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        below = encoded(seq=MAX_SEQ - 1, stream_id=entry_id(1))
        top = encoded(seq=MAX_SEQ, stream_id=entry_id(2))

        applied = await apply_stamped(
            store, [below, top, encoded(seq=MAX_SEQ - 2, stream_id=entry_id(3))]
        )

        assert applied.judgements == [NEW_APPLY, NEW_APPLY, STALE]
        assert applied.stamps[1] == b'"event_id":%d,"prev_event_id":%d,' % (MAX_SEQ, MAX_SEQ - 1)
        assert (
            await streams_redis.hmget(JOB.markers, "last", "last_id") == [str(MAX_SEQ).encode()] * 2
        )
        await hold(streams_redis, 2)
        assert await apply(store, [encoded(seq=MAX_SEQ, stream_id=entry_id(4))]) == [DUPLICATE]


class TestOldMarkers:
    """Markers written before event ids: a seq's bare entry id, no "last_id"."""

    @pytest.fixture(autouse=True)
    async def _old_markers(self, streams_redis: Redis) -> None:
        await streams_redis.hset(
            JOB.markers, mapping={"5": entry_id(5), "last": "5", "history_bytes": "0"}
        )

    async def test_the_entry_that_applied_a_seq_republishes_with_its_seq_as_event_id(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        applied = await apply_stamped(store, [encoded(seq=5, stream_id=entry_id(5))])

        assert (applied.judgements, applied.stamps) == ([NEW_REPUBLISH], [b'"event_id":5,'])
        assert await streams_redis.hget(JOB.markers, "5") == entry_id(5).encode()

    async def test_another_entry_is_a_duplicate_while_the_stream_holds_the_old_one(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await hold(streams_redis, 5)

        assert await apply(store, [encoded(seq=5, stream_id=entry_id(6))]) == [DUPLICATE]

    async def test_an_entry_in_place_of_a_gone_one_rewrites_the_marker_with_its_stamp(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await hold(streams_redis, 4, 6)  # entry_id(5) was never held

        applied = await apply_stamped(store, [encoded(seq=5, stream_id=entry_id(6))])

        assert (applied.judgements, applied.stamps) == ([NEW_IN_PLACE_OF_GONE], [b'"event_id":5,'])
        assert await streams_redis.hget(JOB.markers, "5") == entry_id(6).encode() + (
            b' "event_id":5,'
        )

    async def test_the_next_seq_follows_the_last_one_as_its_event_id(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        event = encoded(seq=6, stream_id=entry_id(6))

        applied = await apply_stamped(store, [event])

        assert (applied.judgements, applied.stamps) == (
            [NEW_APPLY],
            [b'"event_id":6,"prev_event_id":5,'],
        )
        assert await streams_redis.hmget(JOB.markers, "6", "last", "last_id") == [
            entry_id(6).encode() + b' "event_id":6,"prev_event_id":5,',
            b"6",
            b"6",
        ]


class TestTokens:
    """Codes 6 to 9, token duplicates and stale tokens: the job's text and its hash."""

    async def test_code_0_appends_a_token_and_records_it(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        applied = await apply_stamped(store, [token(1001, "Hé", node="plan")])
        await apply(store, [token(1002, "llo", node="plan")])

        assert (applied.judgements, applied.stamps) == ([NEW_APPLY], [b'"event_id":1001,'])
        assert await streams_redis.get(CHAT_JOB.text) == "Héllo".encode()
        assert await streams_redis.hgetall(CHAT_JOB.text_state) == {
            b"attempt": b"0",
            b"seq": b"1002",
            b"id": b"1002",
            b"entry": entry_id(1002).encode(),
            b"bytes": b"6",
            b"full": b"0",
            b"node": b"plan",
            b"run_at": b"0",
            b"runs": b"",
        }
        # Tokens write no state or history: those are the stage events'.
        assert await streams_redis.exists(CHAT_JOB.state, CHAT_JOB.history) == 0
        assert await markers_renewed_now(streams_redis, CHAT_JOB) == {b"last_id": b"1002"}

    async def test_each_nodes_run_is_closed_when_another_node_writes(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [token(1001, "ab", node="plan"), token(1002, "c", node="act")])
        await apply(store, [token(1003, "de", node="plan"), token(1004, "!")])

        assert await streams_redis.get(CHAT_JOB.text) == b"abcde!"
        assert await streams_redis.hmget(CHAT_JOB.text_state, "runs", "node", "run_at") == [
            b"plan\t0\t2\nact\t2\t3\nplan\t3\t5\n",
            b"",  # the last token names no node: its bytes are no node's
            b"5",
        ]
        text = await store.text("chat", "job-1")
        assert text is not None
        assert text.by_node() == {"plan": "abde", "act": "c"}

    async def test_code_2_a_token_at_or_below_the_last_seq_is_not_appended(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [token(1001, "a"), token(1002, "b")])
        before = await _snapshot(streams_redis, CHAT_JOB)

        applied = await apply_stamped(store, [token(1002, "b"), token(1001, "a", n=9)])

        assert (applied.judgements, applied.stamps) == ([DUPLICATE] * 2, [None] * 2)
        assert await _snapshot(streams_redis, CHAT_JOB) == before

    async def test_code_3_a_token_of_an_older_attempt_is_stale(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [token(1001, "new", attempt=2)])
        before = await _snapshot(streams_redis, CHAT_JOB)

        applied = await apply_stamped(store, [token(1002, "old", attempt=1)])

        assert (applied.judgements, applied.stamps) == ([STALE], [None])
        assert await _snapshot(streams_redis, CHAT_JOB) == before

    async def test_code_6_a_newer_attempt_restarts_the_text_and_its_runs(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [token(1001, "old ", node="a"), token(1002, "text", node="b")])

        applied = await apply_stamped(
            store,
            [token(1001, "new", attempt=1, node="c", n=11), token(1002, "!", attempt=1, n=12)],
        )

        assert applied.judgements == [NEW_RESTART, NEW_APPLY]
        # Its ids go on after the old attempt's: the job has one sequence of event ids.
        assert applied.stamps == [
            b'"event_id":1003,"prev_event_id":1002,"restart":true,',
            b'"event_id":1004,"prev_event_id":1003,',
        ]
        assert await streams_redis.get(CHAT_JOB.text) == b"new!"
        assert await streams_redis.hgetall(CHAT_JOB.text_state) == {
            b"attempt": b"1",
            b"seq": b"1002",
            b"id": b"1004",
            b"entry": entry_id(12).encode(),
            b"bytes": b"4",
            b"full": b"0",
            b"node": b"",
            b"run_at": b"3",
            b"runs": b"c\t0\t3\n",
        }

    async def test_code_8_the_token_that_does_not_fit_fills_the_text_and_7_follows(
        self, small_text: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(small_text, [token(1001, "12345"), token(1002, "6789")])

        applied = await apply_stamped(small_text, [token(1003, "ab"), token(1004, "c")])

        assert (applied.judgements, applied.stamps) == ([TEXT_FILLED, TEXT_FULL], [None, None])
        assert await streams_redis.get(CHAT_JOB.text) == b"123456789"
        assert await streams_redis.hmget(CHAT_JOB.text_state, "seq", "id", "bytes", "full") == [
            b"1002",
            b"1002",
            b"9",
            b"1",
        ]
        assert await apply(small_text, [token(1005, "d")]) == [TEXT_FULL]

    async def test_code_9_a_newer_attempt_whose_first_token_does_not_fit_empties_the_text(
        self, small_text: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(small_text, [token(1001, "old")])

        judgements = await apply(small_text, [token(1001, "x" * 11, attempt=1, n=9)])

        assert judgements == [Judgement(Verdict.TEXT_FULL, restarts=True, fills=True)]
        assert await streams_redis.get(CHAT_JOB.text) == b""
        # No token of the new attempt was written: there is no last token to name.
        assert await streams_redis.hgetall(CHAT_JOB.text_state) == {
            b"attempt": b"1",
            b"seq": b"-1",
            b"bytes": b"0",
            b"full": b"1",
            b"node": b"",
            b"run_at": b"0",
            b"runs": b"",
        }
        assert await small_text.text("chat", "job-1") is None
        assert await apply(small_text, [token(1002, "y", attempt=1)]) == [TEXT_FULL]

    async def test_a_full_text_restarts_with_a_newer_attempt(
        self, small_text: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(small_text, [token(1001, "x" * 11)])

        assert await apply(small_text, [token(1001, "fits", attempt=1, n=2)]) == [NEW_RESTART]
        assert await streams_redis.get(CHAT_JOB.text) == b"fits"
        assert await streams_redis.hget(CHAT_JOB.text_state, "full") == b"0"


class TestAfterTheEnd:
    """The markers' "ended" field: "1" once the newest applied stage event ends the job, "2"
    once a token came after that end; a token after the end leaves the text keys alone."""

    async def test_code_a_the_first_token_after_the_end_is_stale_and_3_follows(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [token(1001, "Hi"), chat(180, stage="done", status="completed")])
        markers = await streams_redis.hgetall(CHAT_JOB.markers)
        text = await _text_keys(streams_redis)
        assert markers[b"ended"] == b"1"

        first = await apply_stamped(store, [token(1002, "!"), token(1003, "?")])
        then = await apply_stamped(store, [token(1004, ".")])

        assert first.judgements + then.judgements == [STALE_AFTER_END, STALE, STALE]
        assert first.stamps + then.stamps == [None] * 3
        # Only the markers' "ended" moved on: the first late token was told apart.
        assert await streams_redis.hgetall(CHAT_JOB.markers) == markers | {b"ended": b"2"}
        assert await _text_keys(streams_redis) == text

    async def test_a_token_after_the_end_of_a_job_without_text_writes_no_text_keys(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [chat(162, stage="answer", status="failed")])

        assert await apply(store, [token(1001, "late", attempt=1)]) == [STALE_AFTER_END]
        assert await streams_redis.exists(CHAT_JOB.text_state, CHAT_JOB.text) == 0

    async def test_a_stage_event_that_is_no_end_unmarks_it_and_only_a_change_is_written(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [chat(1, stage="started")])
        assert await streams_redis.hget(CHAT_JOB.markers, "ended") is None

        await apply(store, [chat(180, stage="done", status="completed"), token(1001, "x")])
        assert await streams_redis.hget(CHAT_JOB.markers, "ended") == b"2"

        await apply(store, [chat(190, stage="answer", status="started")])
        assert await streams_redis.hget(CHAT_JOB.markers, "ended") == b"0"
        assert await apply(store, [token(1002, "y")]) == [NEW_APPLY]

    async def test_markers_without_the_field_are_of_a_job_not_ended(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        # Markers written before the field: the job's end is known from its next one on.
        await apply(store, [chat(180, stage="done", status="completed")])
        await streams_redis.hdel(CHAT_JOB.markers, "ended")
        loading = await make_store(streams_redis)

        assert await apply(loading, [token(1001, "a")]) == [NEW_APPLY]


class TestEventIds:
    """One sequence of event ids per job, and the stamps the script puts on what it routes."""

    async def test_a_job_of_stage_events_only_keeps_its_seqs_as_ids(
        self, store: RedisLuaStateStore
    ) -> None:
        events = [encoded(seq=n, stream_id=entry_id(n)) for n in (2, 3, 7)]

        first = await apply_stamped(store, events[:2])
        then = await apply_stamped(store, events[2:])

        assert first.stamps + then.stamps == [
            b'"event_id":2,',
            b'"event_id":3,"prev_event_id":2,',
            b'"event_id":7,"prev_event_id":3,',
        ]

    async def test_stage_events_after_tokens_numbered_higher_get_the_last_id_plus_one(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        started = chat(1, stage="started")
        thinking = chat(2, stage="thinking")
        await apply(store, [started, token(1001, "a"), token(1002, "b")])

        applied = await apply_stamped(store, [thinking, token(1003, "c"), chat(3, stage="saved")])

        assert applied.stamps == [
            b'"event_id":1003,"prev_event_id":1002,',
            b'"event_id":1004,"prev_event_id":1003,',
            b'"event_id":1005,"prev_event_id":1004,',
        ]
        assert await streams_redis.hmget(CHAT_JOB.markers, "last", "last_id") == [b"3", b"1005"]
        assert await streams_redis.lrange(CHAT_JOB.history, 0, 1) == [
            stamped(started.payload, b'"event_id":1,'),
            stamped(thinking.payload, b'"event_id":1003,"prev_event_id":1002,'),
        ]

    async def test_a_terminal_event_carries_the_check_of_the_jobs_text(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        text = "Bonjour, ça va ? ✓"
        done = chat(2, stage="done", status="done")
        await apply(store, [token(1001, text[:9]), token(1002, text[9:])])

        applied = await apply_stamped(store, [token(1003, "!"), done])

        whole = (text + "!").encode()
        fields = b'"event_id":1004,"prev_event_id":1003,"text_check":{"bytes":%d,"sha1":"%s",' % (
            len(whole),
            sha1(whole).encode(),
        )
        assert applied.stamps[1] == fields + b'"truncated":false},'
        assert await streams_redis.get(CHAT_JOB.state) == stamped(done.payload, applied.stamps[1])

    async def test_the_check_of_a_full_text_says_truncated(
        self, small_text: RedisLuaStateStore
    ) -> None:
        done = chat(2, stage="failed", status="failed")

        applied = await apply_stamped(
            small_text, [token(1001, "12345678"), token(1002, "too long"), done]
        )

        assert applied.stamps[2] == (
            b'"event_id":1002,"prev_event_id":1001,'
            b'"text_check":{"bytes":8,"sha1":"%s","truncated":true},' % sha1(b"12345678").encode()
        )

    async def test_a_terminal_event_of_a_job_without_a_text_has_no_check(
        self, store: RedisLuaStateStore
    ) -> None:
        applied = await apply_stamped(store, [chat(1), chat(2, stage="done", status="done")])

        assert applied.stamps == [b'"event_id":1,', b'"event_id":2,"prev_event_id":1,']


class TestReadOrder:
    """The check that nothing pending comes between where a read began and its first entry."""

    async def test_an_entry_read_by_another_consumer_before_the_read_is_a_gap(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        position, earlier, first = await _read_by_two(streams_redis, first_reader="stale")

        applied = await store.apply(
            [encoded(seq=2, stream_id=first)], {SHARD: 1}, {SHARD: ReadStart("me", position, first)}
        )

        assert applied.gaps == {SHARD}
        assert applied.judgements == [None]
        assert await streams_redis.exists(JOB.state, JOB.history, JOB.markers) == 0
        assert earlier != first

    async def test_an_entry_this_consumer_took_without_seeing_it_is_a_gap(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        position, _, first = await _read_by_two(streams_redis, first_reader="me")

        applied = await store.apply(
            [encoded(seq=2, stream_id=first)], {SHARD: 1}, {SHARD: ReadStart("me", position, first)}
        )

        assert applied.gaps == {SHARD}
        assert applied.judgements == [None]

    async def test_a_read_that_began_where_the_last_one_ended_is_applied(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        _, earlier, first = await _read_by_two(streams_redis, first_reader="me")

        applied = await store.apply(
            [encoded(seq=2, stream_id=first)], {SHARD: 1}, {SHARD: ReadStart("me", earlier, first)}
        )

        assert (applied.gaps, applied.judgements) == (frozenset(), [NEW_APPLY])

    async def test_a_fenced_shard_is_fenced_not_a_gap(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        position, _, first = await _read_by_two(streams_redis, first_reader="stale")
        await streams_redis.set(EPOCH, 2)

        applied = await store.apply(
            [encoded(seq=2, stream_id=first)], {SHARD: 1}, {SHARD: ReadStart("me", position, first)}
        )

        assert (applied.fenced, applied.gaps) == ({SHARD}, frozenset())

    async def test_a_stream_without_the_group_is_no_gap(self, store: RedisLuaStateStore) -> None:
        start = ReadStart("me", "0-0", entry_id(1))

        applied = await store.apply(
            [encoded(seq=1, stream_id=entry_id(1))], {SHARD: 1}, {SHARD: start}
        )

        assert (applied.gaps, applied.judgements) == (frozenset(), [NEW_APPLY])


async def _read_by_two(redis: Redis, *, first_reader: str) -> tuple[str, str, str]:
    """Two entries on the shard: `first_reader` reads the first, "me" the second. Returns
    the position before both, the first's id and the second's."""
    await redis.xgroup_create(SHARD, GROUP, id="0", mkstream=True)
    earlier = _text(await redis.xadd(SHARD, {"n": "1"}))
    later = _text(await redis.xadd(SHARD, {"n": "2"}))
    await redis.xreadgroup(GROUP, first_reader, {SHARD: ">"}, count=1)
    await redis.xreadgroup(GROUP, "me", {SHARD: ">"}, count=1)
    return "0-0", earlier, later


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _expire_all(redis: Redis, seconds: int, *keys: str) -> None:
    for key in keys:
        await redis.expire(key, seconds)


class TestKeys:
    """TTLs, history and payload bytes as written by the script."""

    async def test_state_history_and_markers_get_their_configured_ttls(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])

        assert 0 < await streams_redis.ttl(JOB.state) <= STATE_TTL_S
        assert STATE_TTL_S < await streams_redis.ttl(JOB.history) <= STATE_TTL_S + RENEW_EVERY_S
        assert MARKERS_TTL_S < await streams_redis.ttl(JOB.markers) <= MARKERS_TTL_S + RENEW_EVERY_S

    async def test_the_text_and_its_hash_get_the_historys_ttl(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [token(1001, "a")])

        for key in (CHAT_JOB.text_state, CHAT_JOB.text):
            assert STATE_TTL_S < await streams_redis.ttl(key) <= STATE_TTL_S + RENEW_EVERY_S
        ttl = await streams_redis.ttl(CHAT_JOB.markers)
        assert MARKERS_TTL_S < ttl <= MARKERS_TTL_S + RENEW_EVERY_S

    @pytest.mark.parametrize("renewed_ago_s", [RENEW_EVERY_S, -1000], ids=["due", "clock-back"])
    async def test_a_new_event_renews_the_ttls_once_the_last_renewal_is_due(
        self, store: RedisLuaStateStore, streams_redis: Redis, renewed_ago_s: int
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        now_s, _ = await streams_redis.time()
        await streams_redis.hset(JOB.markers, "renewed", now_s - renewed_ago_s)
        await _expire_all(streams_redis, 5, JOB.state, JOB.history, JOB.markers)
        # The renewal as a router that loads the job's record finds it.
        loading = await make_store(streams_redis)

        await apply(loading, [encoded(seq=2, stream_id=entry_id(2))])

        assert 5 < await streams_redis.ttl(JOB.state) <= STATE_TTL_S
        assert STATE_TTL_S < await streams_redis.ttl(JOB.history) <= STATE_TTL_S + RENEW_EVERY_S
        assert MARKERS_TTL_S < await streams_redis.ttl(JOB.markers) <= MARKERS_TTL_S + RENEW_EVERY_S
        assert int(await streams_redis.hget(JOB.markers, "renewed") or 0) >= now_s

    @pytest.mark.parametrize("due_with", ["token", "stage event"])
    async def test_whichever_event_comes_due_renews_all_the_jobs_keys(
        self, store: RedisLuaStateStore, streams_redis: Redis, due_with: str
    ) -> None:
        # Tokens and stage events share one renewal: the one that takes it renews the keys
        # of the other kind too, or those would expire while the job goes on.
        await apply(store, [chat(1), token(1001, "a")])
        now_s, _ = await streams_redis.time()
        await streams_redis.hset(CHAT_JOB.markers, "renewed", now_s - RENEW_EVERY_S)
        keys = (CHAT_JOB.history, CHAT_JOB.text_state, CHAT_JOB.text, CHAT_JOB.markers)
        await _expire_all(streams_redis, 5, *keys)
        loading = await make_store(streams_redis)

        await apply(loading, [token(1002, "b") if due_with == "token" else chat(2)])

        for key in keys[:3]:
            assert STATE_TTL_S < await streams_redis.ttl(key) <= STATE_TTL_S + RENEW_EVERY_S
        ttl = await streams_redis.ttl(CHAT_JOB.markers)
        assert MARKERS_TTL_S < ttl <= MARKERS_TTL_S + RENEW_EVERY_S

    async def test_within_a_renewal_window_only_the_state_ttl_is_set(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        await _expire_all(streams_redis, 50, JOB.state, JOB.history, JOB.markers)

        await apply(store, [encoded(seq=2, stream_id=entry_id(2))])

        assert 50 < await streams_redis.ttl(JOB.state) <= STATE_TTL_S
        assert 0 < await streams_redis.ttl(JOB.history) <= 50
        assert 0 < await streams_redis.ttl(JOB.markers) <= 50

    async def test_within_a_renewal_window_a_token_sets_no_ttl(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [token(1001, "a")])
        await _expire_all(streams_redis, 50, CHAT_JOB.text_state, CHAT_JOB.text, CHAT_JOB.markers)

        await apply(store, [token(1002, "b")])

        for key in (CHAT_JOB.text_state, CHAT_JOB.text, CHAT_JOB.markers):
            assert 0 < await streams_redis.ttl(key) <= 50

    async def test_a_restarted_text_keeps_the_ttl_of_its_hash(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        # The text and its hash expire together: a hash left without its text would count
        # bytes the text no longer has.
        await apply(store, [token(1001, "a")])

        await apply(store, [token(1001, "b", attempt=1, n=2)])

        ttls = [await streams_redis.ttl(key) for key in (CHAT_JOB.text_state, CHAT_JOB.text)]
        assert all(STATE_TTL_S < ttl <= STATE_TTL_S + RENEW_EVERY_S for ttl in ttls), ttls

    async def test_a_history_created_within_a_renewal_window_gets_its_ttl(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        await streams_redis.delete(JOB.history)
        loading = await make_store(streams_redis)

        await apply(loading, [encoded(seq=2, stream_id=entry_id(2))])

        assert STATE_TTL_S < await streams_redis.ttl(JOB.history) <= STATE_TTL_S + RENEW_EVERY_S

    async def test_a_text_created_within_a_renewal_window_gets_its_ttl(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [chat(1)])

        await apply(store, [token(1001, "a")])

        for key in (CHAT_JOB.text_state, CHAT_JOB.text):
            assert STATE_TTL_S < await streams_redis.ttl(key) <= STATE_TTL_S + RENEW_EVERY_S

    async def test_with_the_default_ttls_the_renewal_window_is_a_minute(
        self, streams_redis: Redis
    ) -> None:
        state_ttl_s = Settings.model_fields["state_ttl_s"].default
        markers_ttl_s = Settings.model_fields["published_ttl_s"].default
        store = await make_store(
            streams_redis, state_ttl_s=state_ttl_s, markers_ttl_s=markers_ttl_s
        )

        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])

        assert state_ttl_s < await streams_redis.ttl(JOB.history) <= state_ttl_s + 60
        assert markers_ttl_s < await streams_redis.ttl(JOB.markers) <= markers_ttl_s + 60

    async def test_history_is_trimmed_to_the_newest_payloads_across_batches(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        events = [encoded(seq=n, stream_id=entry_id(n)) for n in range(1, 8)]
        stored = kept_in_turn(events)

        await apply(store, events[:5])
        after_first = await streams_redis.lrange(JOB.history, 0, -1)
        await apply(store, events[5:])

        assert after_first == stored[2:5]
        assert await streams_redis.lrange(JOB.history, 0, -1) == stored[4:]
        assert await streams_redis.get(JOB.state) == stored[-1]

    async def test_payload_bytes_are_stored_exactly(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        # The stamp goes after the opening brace; every byte after it is kept as it came.
        payload = b"{" + bytes(range(256)) + "résumé ✓".encode()
        stored = b'{"event_id":1,' + payload[1:]

        await apply(store, [raw(payload, seq=1, stream_id=entry_id(1))])

        assert await streams_redis.get(JOB.state) == stored
        assert await streams_redis.lrange(JOB.history, 0, -1) == [stored]
        assert (await store.view("scan", "job-1")).state == stored

    async def test_token_bytes_are_stored_exactly(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        content = "\x00\r\n\t résumé ✓ \U0001f600"

        await apply(store, [token(1001, content), token(1002, content)])

        assert await streams_redis.get(CHAT_JOB.text) == (content * 2).encode()

    async def test_a_batch_of_300_events_across_100_jobs_is_applied_in_one_call(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        jobs = [f"job-{n:03}" for n in range(100)]
        batch = [
            encoded(job_id=job, seq=seq, stream_id=entry_id(seq * 1000 + n))
            for seq in (1, 2, 3)
            for n, job in enumerate(jobs)
        ]

        judgements = await apply(store, batch)

        assert judgements == [NEW_APPLY] * 300
        for job in jobs:
            keys = JobKeys.of("scan", job)
            mine = kept_in_turn([item for item in batch if item.event.job_id == job])
            assert await streams_redis.get(keys.state) == mine[-1]
            assert await streams_redis.lrange(keys.history, 0, -1) == mine
            assert await streams_redis.hmget(keys.markers, "last", "last_id") == [b"3", b"3"]
        assert len(await streams_redis.keys("scan:*")) == 300

    async def test_a_batch_longer_than_one_argument_chunk_is_applied_whole(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        batch = [encoded(seq=n, stream_id=entry_id(n)) for n in range(1, 2501)]
        replay = [encoded(seq=n, stream_id=entry_id(10_000 + n)) for n in range(1, 2501)]

        await hold(streams_redis, *range(1, 2501))
        assert await apply(store, batch) == [NEW_APPLY] * 2500
        assert await apply(store, replay) == [DUPLICATE] * 2500
        # The seqs, then last, last_id, history_bytes, sizes and renewed.
        assert await streams_redis.hlen(JOB.markers) == 2505
        assert await streams_redis.hget(JOB.markers, "last") == b"2500"
        assert await streams_redis.lrange(JOB.history, 0, -1) == kept_in_turn(batch)[-HISTORY_SIZE:]

    async def test_a_batch_of_many_tokens_is_appended_whole(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        batch = [token(1000 + n, f"{n} ") for n in range(1, 2501)]

        assert await apply(store, batch) == [NEW_APPLY] * 2500
        assert (
            await streams_redis.get(CHAT_JOB.text)
            == "".join(f"{n} " for n in range(1, 2501)).encode()
        )
        assert await streams_redis.hmget(CHAT_JOB.text_state, "seq", "id") == [b"3500", b"3500"]


class TestMarkersExpiry:
    async def test_once_the_markers_expire_an_older_seq_is_accepted_as_new(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        """The TTL-window contract: dedup and ordering hold while the job's markers live.

        The markers expire `markers_ttl_s` after the job's newest applied event; after that
        the job is unknown again and any seq, older ones included, is applied as NEW. The
        script must carry on from an absent markers hash without erroring.
        """
        await apply(store, [encoded(seq=5, stream_id=entry_id(5))])
        await streams_redis.pexpire(JOB.markers, 1)

        async def markers_gone() -> bool:
            return not await streams_redis.exists(JOB.markers)

        await wait_until(markers_gone, what="the markers hash to expire")
        older = encoded(seq=3, stream_id=entry_id(3), stage="late")
        # A router holding the record would keep it well inside the TTLs; one loading it
        # finds none.
        loading = await make_store(streams_redis)

        assert await apply(loading, [older]) == [NEW_APPLY]
        # Its ids start again too: nothing is known of the job's earlier ones.
        assert await streams_redis.get(JOB.state) == kept(older)
        history = await streams_redis.lrange(JOB.history, 0, -1)
        assert await markers_renewed_now(streams_redis) == {
            b"3": entry_id(3).encode() + b' "event_id":3,',
            b"last": b"3",
            b"last_id": b"3",
            b"history_bytes": str(sum(len(p) for p in history)).encode(),
            b"sizes": b",".join(str(len(p)).encode() for p in history),
        }
        assert 0 < await streams_redis.ttl(JOB.markers) <= MARKERS_TTL_S + RENEW_EVERY_S


def sized(seq: int, size: int) -> EncodedEvent:
    """Event `seq` of a job applied from seq 1 in turn, stored in exactly `size` bytes."""
    fields = stamp(seq, seq - 1 if seq > 1 else None)
    padding = size - len(fields) - len(b'{"p":""}')
    payload = b'{"p":"' + f"{seq}:".encode().ljust(padding, b"x") + b'"}'
    return raw(payload, seq=seq, stream_id=entry_id(seq))


class TestHistoryBytes:
    """The byte count kept beside the markers, which outlive the history."""

    @pytest.fixture
    async def small(self, streams_redis: Redis) -> RedisLuaStateStore:
        return await make_store(streams_redis, history_size=100, history_max_bytes=10_000)

    async def test_a_history_that_expired_is_counted_from_zero_again(
        self, small: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(small, [sized(1, 3000), sized(2, 3000)])
        await streams_redis.delete(JOB.history)  # expired: the state TTL is shorter
        fresh = [sized(3, 4000), sized(4, 4000)]
        loading = await make_store(streams_redis, history_size=100, history_max_bytes=10_000)

        await apply(loading, fresh)

        assert await streams_redis.lrange(JOB.history, 0, -1) == kept_in_turn(fresh, 2)
        assert await streams_redis.hget(JOB.markers, "history_bytes") == b"8000"

    async def test_a_history_written_before_bytes_were_counted_is_counted_once(
        self, small: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        older = [kept(sized(n, 4000), n - 1 or None) for n in (1, 2, 3)]
        await streams_redis.rpush(JOB.history, *older)
        await streams_redis.hset(JOB.markers, "last", "3")
        newest = sized(4, 1000)

        await apply(small, [newest])

        assert await streams_redis.lrange(JOB.history, 0, -1) == [*older[1:], kept(newest, 3)]
        assert await streams_redis.hget(JOB.markers, "history_bytes") == b"9000"

    async def test_a_large_history_is_trimmed_in_the_one_script_call_of_the_batch(
        self, small: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        batch = [sized(n, 1000) for n in range(1, 41)]

        assert await apply(small, batch) == [NEW_APPLY] * 40

        assert await streams_redis.lrange(JOB.history, 0, -1) == kept_in_turn(batch)[-10:]
        assert await streams_redis.hget(JOB.markers, "history_bytes") == b"10000"


async def _loads(redis: Redis) -> int:
    """How many job records the server has been asked for (one HGETALL each)."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


class TestHeldRecords:
    """The records of the jobs a store wrote are held under the shard's fencing token and not
    read again; a new token, a fenced or failed store call drops them."""

    async def test_a_job_written_is_not_read_again_under_the_same_token(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        loads = await _loads(streams_redis)

        judged = await apply(
            store,
            [encoded(seq=2, stream_id=entry_id(2)), encoded(seq=1, stream_id=entry_id(1))],
        )

        assert judged == [NEW_APPLY, NEW_REPUBLISH]
        assert await _loads(streams_redis) == loads
        assert store.held_jobs == 1

    async def test_a_held_texts_bytes_are_read_only_for_a_terminal_events_check(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [chat(1), token(1001, "ab")])
        await apply(store, [token(1002, "c")])

        applied = await apply_stamped(store, [chat(2, stage="done", status="completed")])

        assert applied.judgements == [NEW_APPLY]
        assert b'"bytes":3,"sha1":"%s"' % sha1(b"abc").encode() in (applied.stamps[0] or b"")

    async def test_a_new_token_drops_the_shards_records(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        redelivered = encoded(seq=1, stream_id=entry_id(1))
        await apply(store, [redelivered])
        # Written behind the holder's back: only a store that reads the record sees it.
        await streams_redis.delete(JOB.markers)
        assert await apply(store, [redelivered]) == [NEW_REPUBLISH]
        await streams_redis.set(EPOCH, 2)

        applied = await store.apply([redelivered], {SHARD: 2})

        assert applied.judgements == [NEW_APPLY]

    async def test_a_fenced_store_call_drops_the_shards_records(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1)), chat(1)])
        await streams_redis.set(EPOCH, 2)

        applied = await store.apply([encoded(seq=2, stream_id=entry_id(2))], {SHARD: 1})

        assert applied.fenced == {SHARD}
        assert store.held_jobs == 1  # the chat shard's job

    async def test_a_failed_store_call_drops_the_records_of_its_shards(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        # A key of the wrong type makes the script fail after some of its writes.
        await streams_redis.delete(JOB.history)
        await streams_redis.set(JOB.history, "x")

        with pytest.raises(Exception):  # noqa: B017, PT011 - the port's error, whichever
            await apply(store, [encoded(seq=2, stream_id=entry_id(2))])

        assert store.held_jobs == 0

    async def test_a_job_first_seen_at_seq_0_is_assumed_new_and_not_read(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        loads = await _loads(streams_redis)

        judged = await apply(store, [encoded(seq=0, stream_id=entry_id(1))])

        assert judged == [NEW_APPLY]
        assert await _loads(streams_redis) == loads
        assert await streams_redis.hget(JOB.markers, "last") == b"0"

    async def test_a_job_assumed_new_that_has_keys_is_read_and_its_batch_settled_again(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        first, second = encoded(seq=0, stream_id=entry_id(1)), encoded(seq=1, stream_id=entry_id(2))
        await hold(streams_redis, 1)
        await apply(store, [first, second])
        before = await _snapshot(streams_redis)
        # A router that holds nothing (restarted, or taking the shard over) meets a retry of
        # the job's first event, from another entry, beside another job's first.
        restarted = await make_store(streams_redis)
        retry = encoded(seq=0, stream_id=entry_id(3))
        other = encoded(seq=0, stream_id=entry_id(4), job_id="job-2")

        judged = await apply(restarted, [retry, other])

        assert judged == [DUPLICATE, NEW_APPLY]
        assert await _snapshot(streams_redis) == before
        assert await streams_redis.hget(JobKeys.of("scan", "job-2").markers, "last") == b"0"

    async def test_a_job_taken_for_new_whose_text_state_alone_exists_is_read(
        self, small_text: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        # The first token does not fit: the text state is written, nothing else.
        assert await apply(small_text, [token(1001, "x" * (SMALL_TEXT + 1))]) == [TEXT_FILLED]
        restarted = await make_store(streams_redis, text_max_bytes=SMALL_TEXT)

        judged = await apply(restarted, [chat(0), token(1002, "y")])

        assert judged == [NEW_APPLY, TEXT_FULL]

    async def test_the_least_recently_used_records_go_beyond_the_bound(
        self, streams_redis: Redis
    ) -> None:
        store = await make_store(streams_redis, held_jobs=2)
        for job in ("a", "b", "c"):
            await apply(store, [encoded(seq=1, stream_id=entry_id(1), job_id=job)])
        loads = await _loads(streams_redis)

        await apply(store, [encoded(seq=2, stream_id=entry_id(2), job_id="c")])
        held_c = await _loads(streams_redis)
        await apply(store, [encoded(seq=2, stream_id=entry_id(2), job_id="a")])

        assert store.held_jobs == 2
        assert (held_c, await _loads(streams_redis)) == (loads, loads + 1)


async def _text_keys(redis: Redis, job: JobKeys = CHAT_JOB) -> tuple[object, ...]:
    return (await redis.hgetall(job.text_state), await redis.get(job.text))


async def _snapshot(redis: Redis, job: JobKeys = JOB) -> tuple[object, ...]:
    return (
        await redis.get(job.state),
        await redis.lrange(job.history, 0, -1),
        await redis.hgetall(job.markers),
        await redis.hgetall(job.text_state),
        await redis.get(job.text),
    )
