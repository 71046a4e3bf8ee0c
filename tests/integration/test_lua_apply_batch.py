"""apply_batch.lua on a real Redis: every branch, the keys it writes and their TTLs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.adapters.redis.state_store import RedisLuaStateStore
from eco_router.application.messages import EncodedEvent, ReadStart
from eco_router.domain.verdict import (
    DUPLICATE,
    NEW_APPLY,
    NEW_IN_PLACE_OF_GONE,
    NEW_REPUBLISH,
    STALE,
    Judgement,
)
from eco_router.entrypoints.settings import Settings
from tests.contracts.factories import FAMILIES, encoded, entry_id, wait_until

STATE_TTL_S = 100
MARKERS_TTL_S = 200
# The script renews the history's and the markers' TTLs at most this often (a tenth of the
# state TTL, at most a minute), and keeps them that much longer.
RENEW_EVERY_S = 10
HISTORY_SIZE = 3
HISTORY_MAX_BYTES = 1 << 20
JOB = JobKeys.of("scan", "job-1")
MAX_SEQ = 2**53 - 1


SHARD = "scan:events:0"
GROUP = "router"
EPOCH = GroupKeys(GROUP).epoch(SHARD)


@pytest.fixture
async def store(streams_redis: Redis) -> RedisLuaStateStore:
    await streams_redis.set(EPOCH, 1)
    return RedisLuaStateStore(
        streams_redis,
        families=FAMILIES,
        group=GROUP,
        state_ttl_s=STATE_TTL_S,
        markers_ttl_s=MARKERS_TTL_S,
        history_size=HISTORY_SIZE,
    )


async def apply(
    store: RedisLuaStateStore, events: Sequence[EncodedEvent]
) -> list[Judgement | None]:
    """Apply as the holder of the shard (fencing token 1)."""
    applied = await store.apply(events, {SHARD: 1})
    assert applied.fenced == frozenset()
    return applied.judgements


async def markers_renewed_now(redis: Redis) -> dict[bytes, bytes]:
    """The job's markers but "renewed", which must be the server's time (within a second)."""
    markers = await redis.hgetall(JOB.markers)
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


class TestBranches:
    """The one-character codes the script returns and what the adapter makes of them."""

    async def test_code_4_and_the_shard_index_when_the_token_moved_on(
        self, streams_redis: Redis
    ) -> None:
        script = streams_redis.register_script(load_lua("apply_batch.lua"))
        other = JobKeys.of("chat", "job-2")
        chat_epoch = GroupKeys(GROUP).epoch("chat:events:0")
        await streams_redis.set(EPOCH, 2)
        await streams_redis.set(chat_epoch, 1)
        keys = [EPOCH, chat_epoch, SHARD, "chat:events:0", JOB.state, JOB.history, JOB.markers]
        keys += [other.state, other.history, other.markers]
        # Two shards held with token 1 (the first one's epoch moved on), no read to check,
        # job 1 on shard 1, job 2 on shard 2.
        head = [STATE_TTL_S, MARKERS_TTL_S, HISTORY_SIZE, HISTORY_MAX_BYTES, GROUP, 2]
        head += [1, "", "", 1, "", "", "", "", 1, 2]
        events = [(1, 5, entry_id(1), b"fenced"), (2, 1, entry_id(2), b"applied")]

        codes, fenced, gaps = await script(
            keys=keys, args=head + [v for event in events for v in event]
        )

        assert (codes, fenced, gaps) == (b"40", [1], [])
        assert await streams_redis.exists(JOB.state, JOB.history, JOB.markers) == 0
        assert await streams_redis.get(other.state) == b"applied"

    async def test_the_script_returns_one_code_per_event_for_all_four_branches(
        self, streams_redis: Redis
    ) -> None:
        script = streams_redis.register_script(load_lua("apply_batch.lua"))
        await streams_redis.set(EPOCH, 1)
        await hold(streams_redis, 1)
        keys = [EPOCH, SHARD, JOB.state, JOB.history, JOB.markers]
        # TTLs, history size and bytes, the group, one shard with token 1 and no read to
        # check, the job on shard 1.
        head = [STATE_TTL_S, MARKERS_TTL_S, HISTORY_SIZE, HISTORY_MAX_BYTES, GROUP, 1]
        head += [1, "", "", "", 1]
        events = [
            (1, 5, entry_id(1), b"applied"),
            (1, 5, entry_id(1), b"same entry again"),
            (1, 5, entry_id(2), b"other entry, same seq"),
            (1, 4, entry_id(3), b"lower seq"),
        ]

        codes, fenced, gaps = await script(
            keys=keys, args=head + [v for event in events for v in event]
        )

        assert (codes, fenced, gaps) == (b"0123", [], [])
        assert await streams_redis.get(JOB.state) == b"applied"
        assert await streams_redis.lrange(JOB.history, 0, -1) == [b"applied"]

    async def test_code_0_applies_state_history_and_markers(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        event = encoded(seq=7, stream_id=entry_id(7))

        assert await apply(store, [event]) == [NEW_APPLY]

        assert await streams_redis.get(JOB.state) == event.payload
        assert await streams_redis.lrange(JOB.history, 0, -1) == [event.payload]
        assert await markers_renewed_now(streams_redis) == {
            b"7": entry_id(7).encode(),
            b"last": b"7",
            b"history_bytes": str(len(event.payload)).encode(),
        }

    async def test_code_1_republishes_without_writing(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        event = encoded(seq=1, stream_id=entry_id(1))
        await apply(store, [event])
        before = await _snapshot(streams_redis)

        assert await apply(store, [event]) == [NEW_REPUBLISH]

        assert await _snapshot(streams_redis) == before

    async def test_code_2_is_a_duplicate_and_writes_nothing(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await hold(streams_redis, 1)
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        before = await _snapshot(streams_redis)

        judgements = await apply(store, [encoded(seq=1, stream_id=entry_id(2), stage="copy")])

        assert judgements == [DUPLICATE]
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

        judgements = await apply(store, [encoded(seq=1, stream_id=entry_id(4), stage="copy")])

        assert judgements == [NEW_IN_PLACE_OF_GONE]
        assert await streams_redis.hgetall(JOB.markers) == before | {b"1": entry_id(4).encode()}
        assert await streams_redis.get(JOB.state) == applied.payload
        assert await streams_redis.lrange(JOB.history, 0, -1) == [applied.payload]
        assert await apply(store, [encoded(seq=1, stream_id=entry_id(5))]) == [DUPLICATE]

    async def test_code_3_is_stale_and_writes_nothing(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=5, stream_id=entry_id(5))])
        before = await _snapshot(streams_redis)

        judgements = await apply(store, [encoded(seq=3, stream_id=entry_id(3), stage="late")])

        assert judgements == [STALE]
        assert await _snapshot(streams_redis) == before

    async def test_code_3_also_covers_a_seq_equal_to_the_last_one_without_its_marker(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        applied = encoded(seq=5, stream_id=entry_id(5))
        await apply(store, [applied])
        # Only "last" is left: the equal seq cannot be told apart from a replay, so it is stale.
        await streams_redis.hdel(JOB.markers, "5")

        judgements = await apply(store, [encoded(seq=5, stream_id=entry_id(6), stage="copy")])

        assert judgements == [STALE]
        assert await streams_redis.get(JOB.state) == applied.payload

    async def test_the_largest_allowed_seq_is_compared_and_stored_exactly(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        below = encoded(seq=MAX_SEQ - 1, stream_id=entry_id(1))
        top = encoded(seq=MAX_SEQ, stream_id=entry_id(2))

        judgements = await apply(
            store, [below, top, encoded(seq=MAX_SEQ - 2, stream_id=entry_id(3))]
        )

        assert judgements == [NEW_APPLY, NEW_APPLY, STALE]
        assert await streams_redis.hget(JOB.markers, "last") == str(MAX_SEQ).encode()
        await hold(streams_redis, 2)
        assert await apply(store, [encoded(seq=MAX_SEQ, stream_id=entry_id(4))]) == [DUPLICATE]


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


class TestKeys:
    """TTLs, history and payload bytes as written by the script."""

    async def test_state_history_and_markers_get_their_configured_ttls(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])

        assert 0 < await streams_redis.ttl(JOB.state) <= STATE_TTL_S
        assert STATE_TTL_S < await streams_redis.ttl(JOB.history) <= STATE_TTL_S + RENEW_EVERY_S
        assert MARKERS_TTL_S < await streams_redis.ttl(JOB.markers) <= MARKERS_TTL_S + RENEW_EVERY_S

    @pytest.mark.parametrize("renewed_ago_s", [RENEW_EVERY_S, -1000], ids=["due", "clock-back"])
    async def test_a_new_event_renews_the_ttls_once_the_last_renewal_is_due(
        self, store: RedisLuaStateStore, streams_redis: Redis, renewed_ago_s: int
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        now_s, _ = await streams_redis.time()
        await streams_redis.hset(JOB.markers, "renewed", now_s - renewed_ago_s)
        for key in (JOB.state, JOB.history, JOB.markers):
            await streams_redis.expire(key, 5)

        await apply(store, [encoded(seq=2, stream_id=entry_id(2))])

        assert 5 < await streams_redis.ttl(JOB.state) <= STATE_TTL_S
        assert STATE_TTL_S < await streams_redis.ttl(JOB.history) <= STATE_TTL_S + RENEW_EVERY_S
        assert MARKERS_TTL_S < await streams_redis.ttl(JOB.markers) <= MARKERS_TTL_S + RENEW_EVERY_S
        assert int(await streams_redis.hget(JOB.markers, "renewed") or 0) >= now_s

    async def test_within_a_renewal_window_only_the_state_ttl_is_set(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        for key in (JOB.state, JOB.history, JOB.markers):
            await streams_redis.expire(key, 50)

        await apply(store, [encoded(seq=2, stream_id=entry_id(2))])

        assert 50 < await streams_redis.ttl(JOB.state) <= STATE_TTL_S
        assert 0 < await streams_redis.ttl(JOB.history) <= 50
        assert 0 < await streams_redis.ttl(JOB.markers) <= 50

    async def test_a_history_created_within_a_renewal_window_gets_its_ttl(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])
        await streams_redis.delete(JOB.history)

        await apply(store, [encoded(seq=2, stream_id=entry_id(2))])

        assert STATE_TTL_S < await streams_redis.ttl(JOB.history) <= STATE_TTL_S + RENEW_EVERY_S

    async def test_with_the_default_ttls_the_renewal_window_is_a_minute(
        self, streams_redis: Redis
    ) -> None:
        state_ttl_s = Settings.model_fields["state_ttl_s"].default
        markers_ttl_s = Settings.model_fields["published_ttl_s"].default
        store = RedisLuaStateStore(
            streams_redis,
            families=FAMILIES,
            group=GROUP,
            state_ttl_s=state_ttl_s,
            markers_ttl_s=markers_ttl_s,
            history_size=HISTORY_SIZE,
        )
        await streams_redis.set(EPOCH, 1)

        await apply(store, [encoded(seq=1, stream_id=entry_id(1))])

        assert state_ttl_s < await streams_redis.ttl(JOB.history) <= state_ttl_s + 60
        assert markers_ttl_s < await streams_redis.ttl(JOB.markers) <= markers_ttl_s + 60

    async def test_history_is_trimmed_to_the_newest_payloads_across_batches(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        events = [encoded(seq=n, stream_id=entry_id(n)) for n in range(1, 8)]

        await apply(store, events[:5])
        after_first = await streams_redis.lrange(JOB.history, 0, -1)
        await apply(store, events[5:])

        assert after_first == [e.payload for e in events[2:5]]
        assert await streams_redis.lrange(JOB.history, 0, -1) == [e.payload for e in events[4:]]
        assert await streams_redis.get(JOB.state) == events[-1].payload

    async def test_payload_bytes_are_stored_exactly(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        payload = bytes(range(256)) + "résumé ✓".encode()

        await apply(store, [raw(payload, seq=1, stream_id=entry_id(1))])

        assert await streams_redis.get(JOB.state) == payload
        assert await streams_redis.lrange(JOB.history, 0, -1) == [payload]
        assert (await store.view("scan", "job-1")).state == payload

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
            mine = [item.payload for item in batch if item.event.job_id == job]
            assert await streams_redis.get(keys.state) == mine[-1]
            assert await streams_redis.lrange(keys.history, 0, -1) == mine
            assert await streams_redis.hget(keys.markers, "last") == b"3"
        assert len(await streams_redis.keys("scan:*")) == 300

    async def test_a_batch_longer_than_one_argument_chunk_is_applied_whole(
        self, store: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        batch = [encoded(seq=n, stream_id=entry_id(n)) for n in range(1, 2501)]
        replay = [encoded(seq=n, stream_id=entry_id(10_000 + n)) for n in range(1, 2501)]

        await hold(streams_redis, *range(1, 2501))
        assert await apply(store, batch) == [NEW_APPLY] * 2500
        assert await apply(store, replay) == [DUPLICATE] * 2500
        assert await streams_redis.hlen(JOB.markers) == 2503  # seqs, last, history_bytes, renewed
        assert await streams_redis.hget(JOB.markers, "last") == b"2500"
        assert await streams_redis.lrange(JOB.history, 0, -1) == [
            e.payload for e in batch[-HISTORY_SIZE:]
        ]


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

        assert await apply(store, [older]) == [NEW_APPLY]
        assert await streams_redis.get(JOB.state) == older.payload
        history = await streams_redis.lrange(JOB.history, 0, -1)
        assert await markers_renewed_now(streams_redis) == {
            b"3": entry_id(3).encode(),
            b"last": b"3",
            b"history_bytes": str(sum(len(p) for p in history)).encode(),
        }
        assert 0 < await streams_redis.ttl(JOB.markers) <= MARKERS_TTL_S + RENEW_EVERY_S


def sized(seq: int, size: int) -> EncodedEvent:
    return raw(f"{seq}:".encode().ljust(size, b"x"), seq=seq, stream_id=entry_id(seq))


class TestHistoryBytes:
    """The byte count kept beside the markers, which outlive the history."""

    @pytest.fixture
    async def small(self, streams_redis: Redis) -> RedisLuaStateStore:
        await streams_redis.set(EPOCH, 1)
        return RedisLuaStateStore(
            streams_redis,
            families=FAMILIES,
            group=GROUP,
            state_ttl_s=STATE_TTL_S,
            markers_ttl_s=MARKERS_TTL_S,
            history_size=100,
            history_max_bytes=10_000,
        )

    async def test_a_history_that_expired_is_counted_from_zero_again(
        self, small: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        await apply(small, [sized(1, 3000), sized(2, 3000)])
        await streams_redis.delete(JOB.history)  # expired: the state TTL is shorter
        fresh = [sized(3, 4000), sized(4, 4000)]

        await apply(small, fresh)

        assert await streams_redis.lrange(JOB.history, 0, -1) == [e.payload for e in fresh]
        assert await streams_redis.hget(JOB.markers, "history_bytes") == b"8000"

    async def test_a_history_written_before_bytes_were_counted_is_counted_once(
        self, small: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        older = [sized(n, 4000).payload for n in (1, 2, 3)]
        await streams_redis.rpush(JOB.history, *older)
        await streams_redis.hset(JOB.markers, "last", "3")
        newest = sized(4, 1000)

        await apply(small, [newest])

        assert await streams_redis.lrange(JOB.history, 0, -1) == [*older[1:], newest.payload]
        assert await streams_redis.hget(JOB.markers, "history_bytes") == b"9000"

    async def test_a_large_history_is_trimmed_in_the_one_script_call_of_the_batch(
        self, small: RedisLuaStateStore, streams_redis: Redis
    ) -> None:
        batch = [sized(n, 1000) for n in range(1, 41)]

        assert await apply(small, batch) == [NEW_APPLY] * 40

        assert await streams_redis.lrange(JOB.history, 0, -1) == [e.payload for e in batch[-10:]]
        assert await streams_redis.hget(JOB.markers, "history_bytes") == b"10000"


async def _snapshot(redis: Redis) -> tuple[object, ...]:
    return (
        await redis.get(JOB.state),
        await redis.lrange(JOB.history, 0, -1),
        await redis.hgetall(JOB.markers),
    )
