"""Malformed entries end in the dead-letter stream; the good ones around them are routed."""

from __future__ import annotations

from redis.asyncio import Redis

from tests.integration.support import (
    SCAN,
    PubSubCollector,
    WorkerProcess,
    add_raw,
    dead_letters,
    eventually,
    job_state,
    pending_count,
)

JOB = "scan-mixed"
STREAM = SCAN.stream_for(JOB)
ONE_MEGABYTE = 1024 * 1024


def entry(**fields: bytes) -> dict[bytes, bytes]:
    """Stream fields for `JOB`, overridable field by field (b"" leaves a field out)."""
    base = {b"job_id": JOB.encode(), b"seq": b"1", b"stage": b"scanning"}
    base.update({name.encode(): value for name, value in fields.items()})
    return {name: value for name, value in base.items() if value != b""}


BAD_ENTRIES: dict[str, dict[bytes, bytes]] = {
    "missing_job_id": entry(job_id=b""),
    "seq_not_integer": entry(seq=b"abc"),
    "seq_negative": entry(seq=b"-1"),
    "result_not_json": entry(seq=b"4", result=b"not json"),
    "field_too_large": entry(seq=b"5", stage=b"x" * ONE_MEGABYTE),
    "not_utf8": entry(seq=b"6", stage=b"\xff\xfe scan\xc3"),
    "result_not_finite": entry(seq=b"7", result=b'{"score": NaN}'),
    # 2,000 control characters are 12,000 bytes once escaped in the routed JSON.
    "too_large": entry(seq=b"8", note=b"\x01" * 2000),
}
LAST_SEQ = 10 * (len(BAD_ENTRIES) + 1)


class TestBadEntries:
    async def test_each_bad_entry_is_dead_lettered_with_its_reason_between_routed_good_ones(
        self, worker: WorkerProcess, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        good_ids = []
        bad_ids: dict[str, str] = {}
        for seq, (reason, fields) in enumerate(BAD_ENTRIES.items(), start=1):
            good_ids.append(await add_raw(streams_redis, STREAM, entry(seq=str(seq * 10).encode())))
            bad_ids[reason] = await add_raw(streams_redis, STREAM, fields)
        last = entry(seq=str(LAST_SEQ).encode(), stage=b"done")
        good_ids.append(await add_raw(streams_redis, STREAM, last))

        letters = await eventually(
            lambda: _letters_when(streams_redis, len(BAD_ENTRIES)), what="every dead letter"
        )
        await eventually(
            lambda: len(subscriber.for_job(JOB)) == len(good_ids), what="every routed event"
        )

        assert {f[b"id"].decode(): f[b"reason"].decode() for f in letters} == {
            entry_id: reason for reason, entry_id in bad_ids.items()
        }
        assert {f[b"stream"] for f in letters} == {STREAM.encode()}
        assert [p["stream_id"] for p in subscriber.for_job(JOB)] == good_ids
        assert subscriber.seqs(JOB) == list(range(10, LAST_SEQ + 1, 10))
        state = await job_state(streams_redis, JOB)
        assert state is not None
        assert (state["seq"], state["stage"]) == (LAST_SEQ, "done")
        assert await eventually(lambda: _nothing_pending(streams_redis), what="all acked")
        assert await worker.metric_reaching(
            "event_router_dead_letters_total", len(BAD_ENTRIES), domain="scan"
        ) == len(BAD_ENTRIES)

    async def test_a_dead_letter_keeps_the_original_fields_byte_for_byte(
        self, worker: WorkerProcess, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        raw = {b"job_id": JOB.encode(), b"seq": b"1", b"note": b"caf\xe9 \xff", b"\xfe": b"x"}
        large = entry(seq=b"2", result=b'"' + b"y" * ONE_MEGABYTE + b'"')
        raw_id = await add_raw(streams_redis, STREAM, raw)
        large_id = await add_raw(streams_redis, STREAM, large)
        await add_raw(streams_redis, STREAM, entry(seq=b"3"))

        letters = await eventually(lambda: _letters_when(streams_redis, 2), what="two letters")
        await eventually(lambda: subscriber.seqs(JOB) == [3], what="the good entry routed")

        by_id = {f[b"id"].decode(): f for f in letters}
        assert by_id[raw_id][b"reason"] == b"not_utf8"
        assert _original_fields(by_id[raw_id]) == raw
        assert by_id[large_id][b"reason"] == b"field_too_large"
        assert _original_fields(by_id[large_id]) == large
        assert by_id[raw_id][b"deliveries"] == b"1"
        assert await eventually(lambda: _nothing_pending(streams_redis), what="all acked")


async def _letters_when(redis: Redis, count: int) -> list[dict[bytes, bytes]] | None:
    letters = await dead_letters(redis, SCAN)
    return letters if len(letters) >= count else None


def _original_fields(letter: dict[bytes, bytes]) -> dict[bytes, bytes]:
    prefix = b"field:"
    return {k[len(prefix) :]: v for k, v in letter.items() if k.startswith(prefix)}


async def _nothing_pending(redis: Redis) -> bool:
    return await pending_count(redis) == 0
