"""RouteBatch on the in-memory adapters: judge, apply, publish, dead-letter, acknowledge."""

from __future__ import annotations

from collections import Counter

import pytest

from eco_router.application.errors import BroadcastFailed, TransientError
from eco_router.domain.rejection import RejectReason
from eco_router.domain.verdict import Verdict
from tests.unit.factories import Harness, make_fields

JOB_1_STREAM = "scan:events:2"  # md5 shard of job-1 on 4 shards


@pytest.fixture
async def h() -> Harness:
    harness = Harness()
    await harness.source.prepare()
    return harness


class TestNewEvents:
    async def test_a_new_event_is_applied_published_and_acked(self, h: Harness) -> None:
        entry_id = h.xadd("job-1", 1, progress=10)

        result = await h.route(await h.read())

        expected = {
            "event_id": 1,
            "job_id": "job-1",
            "seq": 1,
            "stage": "scan",
            "status": "running",
            "ts": "2024-05-01T12:00:00Z",
            "progress": 10,
            "stream_id": entry_id,
            "domain": "scan",
        }
        assert result.verdicts == Counter({Verdict.NEW: 1})
        assert result.unsettled == []
        assert h.published("job-1") == [expected]
        assert h.broadcaster.sent[0][0] == "sse:events:job-1"
        assert await h.state("job-1") == expected
        assert h.pending() == {}

    async def test_each_job_is_published_on_its_own_channel(self, h: Harness) -> None:
        h.xadd("job-1", 1)
        h.xadd("job-2", 1)
        h.xadd("job-2", 2)

        await h.route(await h.read())

        assert h.published_seqs("job-1") == [1]
        assert h.published_seqs("job-2") == [1, 2]
        assert {channel for channel, _ in h.broadcaster.sent} == {
            "sse:events:job-1",
            "sse:events:job-2",
        }

    async def test_publish_latency_is_measured_from_the_entry_id(self, h: Harness) -> None:
        h.xadd("job-1", 1)
        h.clock.advance(250)

        await h.route(await h.read())

        assert h.metrics.published["scan"] == 1
        assert h.metrics.latencies_ms == [250.0]

    async def test_a_late_older_event_in_the_same_batch_is_applied_in_seq_order(
        self, h: Harness
    ) -> None:
        h.xadd("job-1", 2)
        h.xadd("job-1", 1)

        result = await h.route(await h.read())

        assert result.verdicts == Counter({Verdict.NEW: 2})
        assert h.published_seqs("job-1") == [1, 2]
        assert await h.history_seqs("job-1") == [1, 2]
        assert (await h.state("job-1") or {})["seq"] == 2


class TestDuplicateAndStale:
    async def test_a_duplicate_seq_is_acked_not_published(self, h: Harness) -> None:
        first = h.xadd("job-1", 1, stage="first")
        await h.route(await h.read())
        h.xadd("job-1", 1, stage="second")

        result = await h.route(await h.read())

        assert result.verdicts == Counter({Verdict.DUPLICATE: 1})
        assert h.published_seqs("job-1") == [1]
        assert await h.state("job-1") == h.published("job-1")[0]
        assert (await h.state("job-1") or {})["stream_id"] == first
        assert await h.history_seqs("job-1") == [1]
        assert h.pending() == {}

    async def test_a_duplicate_in_the_same_batch_is_not_published(self, h: Harness) -> None:
        first = h.xadd("job-1", 1, stage="first")
        h.xadd("job-1", 1, stage="second")

        result = await h.route(await h.read())

        assert result.verdicts == Counter({Verdict.NEW: 1, Verdict.DUPLICATE: 1})
        assert [p["stream_id"] for p in h.published("job-1")] == [first]
        assert h.pending() == {}

    async def test_an_older_seq_in_a_later_batch_is_stale(self, h: Harness) -> None:
        h.xadd("job-1", 5)
        await h.route(await h.read())
        h.xadd("job-1", 3)

        result = await h.route(await h.read())

        assert result.verdicts == Counter({Verdict.STALE: 1})
        assert h.published_seqs("job-1") == [5]
        assert (await h.state("job-1") or {})["seq"] == 5
        assert await h.history_seqs("job-1") == [5]
        assert h.pending() == {}


class TestInvalidEntries:
    async def test_an_invalid_entry_is_dead_lettered_and_acked_between_good_ones(
        self, h: Harness
    ) -> None:
        h.xadd("job-1", 1)
        bad = h.xadd("job-1", 7, stage=b"sc\xffan")
        h.xadd("job-1", 2)

        result = await h.route(await h.read())

        assert result.verdicts == Counter({Verdict.NEW: 2, Verdict.INVALID: 1})
        assert h.published_seqs("job-1") == [1, 2]
        assert h.pending() == {}
        [letter] = h.dead_lettered()
        assert letter[b"stream"] == JOB_1_STREAM.encode()
        assert letter[b"id"] == bad.encode()
        assert letter[b"reason"] == b"not_utf8"
        assert letter[b"detail"]
        assert letter[b"deliveries"] == b"1"
        assert letter[b"dead_at_ms"].isdigit()
        assert {k: v for k, v in letter.items() if k.startswith(b"field:")} == {
            b"field:" + name: value
            for name, value in make_fields(job_id="job-1", seq=7, stage=b"sc\xffan").items()
        }

    async def test_dead_letters_go_to_the_familys_dlq_stream(self, h: Harness) -> None:
        h.xadd_raw("scan:events:0", {b"seq": b"1"})

        await h.route(await h.read())

        assert [f[b"reason"] for _, f in h.streams.entries("scan:events:dlq")] == [
            b"missing_job_id"
        ]
        assert h.metrics.dead_letters == Counter({("scan", RejectReason.MISSING_JOB_ID): 1})
        assert h.metrics.verdicts == Counter({("scan", Verdict.INVALID): 1})

    async def test_a_result_the_encoder_cannot_write_is_dead_lettered_alone(
        self, h: Harness
    ) -> None:
        h.xadd("job-1", 1)
        h.xadd("job-1", 2, result='{"n": 18446744073709551616}')
        h.xadd("job-1", 3)

        result = await h.route(await h.read())

        assert result.verdicts == Counter({Verdict.NEW: 2, Verdict.INVALID: 1})
        assert h.published_seqs("job-1") == [1, 3]
        assert [f[b"reason"] for f in h.dead_lettered()] == [b"result_not_json"]
        assert h.pending() == {}

    async def test_a_stage_event_above_the_event_limit_is_dead_lettered_as_too_large(
        self, h: Harness
    ) -> None:
        # Control characters are escaped six bytes for one: 2 KB of them make 12 KB of JSON.
        h.xadd("job-1", 1)
        h.xadd("job-1", 2, note="\x01" * 2048)
        h.xadd("job-1", 3, note="x" * 7000)

        result = await h.route(await h.read())

        assert result.verdicts == Counter({Verdict.NEW: 2, Verdict.INVALID: 1})
        assert h.published_seqs("job-1") == [1, 3]
        [letter] = h.dead_lettered()
        assert letter[b"reason"] == b"too_large"
        assert b"above 8192 for a stage event" in letter[b"detail"]
        assert h.metrics.dead_letters == Counter({("scan", RejectReason.TOO_LARGE): 1})
        assert h.pending() == {}

    async def test_results_and_terminal_events_get_the_larger_limit(self, h: Harness) -> None:
        h.xadd("job-1", 1, result=f'"{"r" * 60_000}"')
        h.xadd("job-1", 2, stage="vision", status="failed", error="e" * 20_000)
        h.xadd(
            "job-1", 3, stage="done", status="done", a="a" * 60_000, b="b" * 60_000, c="c" * 20_000
        )

        result = await h.route(await h.read())

        assert h.published_seqs("job-1") == [1, 2]
        assert [f[b"reason"] for f in h.dead_lettered()] == [b"too_large"]
        assert result.verdicts == Counter({Verdict.NEW: 2, Verdict.INVALID: 1})


class TestPublishFailure:
    async def test_new_entries_stay_pending_and_the_rest_is_acked(self, h: Harness) -> None:
        h.xadd("job-1", 5)
        await h.route(await h.read())
        h.xadd("job-1", 5)  # duplicate
        h.xadd("job-1", 4)  # stale
        h.xadd("job-1", "x")  # invalid
        owed = {h.xadd("job-1", 6), h.xadd("job-2", 1)}
        h.broadcaster.available = False

        result = await h.route(await h.read())

        assert isinstance(result.error, BroadcastFailed)
        assert {d.entry_id for d in result.unsettled} == owed
        assert set(h.pending()) == owed
        assert h.published_seqs("job-1") == [5]
        assert h.metrics.publish_errors == 2
        assert h.metrics.published["scan"] == 1
        assert len(h.dead_lettered()) == 1

    async def test_routing_the_unsettled_again_publishes_them_once(self, h: Harness) -> None:
        h.xadd("job-1", 1)
        h.xadd("job-1", 2)
        h.broadcaster.available = False
        failed = await h.route(await h.read())
        h.broadcaster.available = True

        result = await h.route(failed.unsettled)

        assert result.verdicts == Counter({Verdict.NEW: 2})
        assert result.unsettled == []
        assert h.published_seqs("job-1") == [1, 2]
        assert await h.history_seqs("job-1") == [1, 2]
        assert h.pending() == {}

    async def test_a_restarted_consumer_republishes_its_own_pending_entries(
        self, h: Harness
    ) -> None:
        h.xadd("job-1", 1)
        h.broadcaster.available = False
        await h.route(await h.read())
        h.broadcaster.available = True
        successor = h.consumer_source(h.consumer)

        redelivered = await h.redeliver(successor)
        await h.route_for(successor)(redelivered)

        assert [d.delivery_count for d in redelivered] == [2]
        assert h.published_seqs("job-1") == [1]
        assert await h.history_seqs("job-1") == [1]
        assert h.pending() == {}


class TestPoisonAndGoneEntries:
    async def test_an_entry_delivered_more_than_max_times_is_dead_lettered_unread(
        self, h: Harness
    ) -> None:
        entry_id = h.xadd("job-1", 1)
        await h.read()  # delivery 1, never acked
        for _ in range(h.max_deliveries):
            redelivered = await h.redeliver()

        result = await h.route(redelivered)

        assert [d.delivery_count for d in redelivered] == [h.max_deliveries + 1]
        assert result.verdicts == Counter()
        assert h.broadcaster.sent == []
        assert await h.state("job-1") is None
        [letter] = h.dead_lettered()
        assert (letter[b"id"], letter[b"reason"]) == (entry_id.encode(), b"max_deliveries")
        assert letter[b"deliveries"] == str(h.max_deliveries + 1).encode()
        assert letter[b"field:seq"] == b"1"
        assert h.metrics.dead_letters == Counter({("scan", RejectReason.MAX_DELIVERIES): 1})
        assert h.pending() == {}

    async def test_an_entry_at_exactly_max_deliveries_is_still_routed(self, h: Harness) -> None:
        h.xadd("job-1", 1)
        await h.read()
        for _ in range(h.max_deliveries - 1):
            redelivered = await h.redeliver()

        await h.route(redelivered)

        assert [d.delivery_count for d in redelivered] == [h.max_deliveries]
        assert h.published_seqs("job-1") == [1]
        assert h.dead_lettered() == []

    async def test_an_entry_deleted_before_its_ack_is_acked_and_counted(self, h: Harness) -> None:
        entry_id = h.xadd("job-1", 1)
        await h.read()
        h.streams.delete_entry(JOB_1_STREAM, entry_id)
        gone = await h.redeliver()

        result = await h.route(gone)

        assert [d.gone for d in gone] == [True]
        assert result.verdicts == Counter()
        assert h.pending() == {}
        assert h.metrics.trimmed == Counter({("scan", 2): 1})
        assert h.broadcaster.sent == []
        assert h.dead_lettered() == []


class TestFailuresBeforePublishing:
    async def test_an_unavailable_state_store_leaves_the_batch_unacked(self, h: Harness) -> None:
        entry_id = h.xadd("job-1", 1)
        h.store.available = False

        with pytest.raises(TransientError):
            await h.route(await h.read())

        assert set(h.pending()) == {entry_id}
        assert h.broadcaster.sent == []

    async def test_an_empty_batch_does_nothing(self, h: Harness) -> None:
        result = await h.route([])

        assert result.verdicts == Counter()
        assert h.broadcaster.sent == []
        assert h.metrics.batches == [0]


class TestMetrics:
    async def test_verdicts_are_counted_per_domain(self, h: Harness) -> None:
        h.xadd("job-1", 5)
        await h.route(await h.read())
        h.xadd("job-1", 6)
        h.xadd("job-2", 1)
        h.xadd("job-1", 6)
        h.xadd("job-1", 3)
        h.xadd("job-1", 7, progress="x")

        result = await h.route(await h.read())

        assert result.verdicts == Counter(
            {Verdict.NEW: 2, Verdict.DUPLICATE: 1, Verdict.STALE: 1, Verdict.INVALID: 1}
        )
        assert h.metrics.verdicts == Counter(
            {
                ("scan", Verdict.NEW): 3,
                ("scan", Verdict.DUPLICATE): 1,
                ("scan", Verdict.STALE): 1,
                ("scan", Verdict.INVALID): 1,
            }
        )
        assert h.metrics.published["scan"] == 3
        assert h.metrics.dead_letters == Counter({("scan", RejectReason.PROGRESS_NOT_INTEGER): 1})
        assert h.metrics.batches == [1, 5]

    async def test_latency_never_goes_negative(self, h: Harness) -> None:
        h.xadd_raw(JOB_1_STREAM, make_fields())
        # An entry id ahead of the router's clock (producer clock skew).
        h.clock.advance(-1_000)

        await h.route(await h.read())

        assert h.metrics.latencies_ms == [0.0]
