"""Stream families, the md5 shard rule shared with producers, and shard numbers in names."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from eco_router.domain.errors import DomainError, InvalidStreamName
from eco_router.domain.streams import (
    SLOTS,
    StreamFamily,
    families_by_stream,
    hash_tag,
    key_slot,
    shard_for,
    shard_of,
    slot_named,
)

JOB_IDS = [f"job-{n}" for n in range(200)] + ["a", "chat:42", "Z_9.x-y", "scan-0001", "ü-job"]


def md5_shard(job_id: str, shards: int) -> int:
    """The producers' rule, written from its description: md5 hex, first 16 digits, mod N."""
    return int(hashlib.md5(job_id.encode("utf-8")).hexdigest()[:16], 16) % shards


class TestShardFor:
    @pytest.mark.parametrize("shards", [4, 8])
    def test_matches_the_producers_md5_rule(self, shards: int) -> None:
        expected = {job_id: md5_shard(job_id, shards) for job_id in JOB_IDS}

        assert {job_id: shard_for(job_id, shards) for job_id in JOB_IDS} == expected

    @pytest.mark.parametrize(
        ("job_id", "on_4", "on_8"),
        [
            ("job-1", 2, 6),
            ("job-2", 3, 3),
            ("scan-0001", 3, 3),
            ("a", 0, 0),
            ("chat:42", 3, 3),
            ("Z_9.x-y", 2, 2),
        ],
    )
    def test_known_job_ids_land_on_their_pinned_shards(
        self, job_id: str, on_4: int, on_8: int
    ) -> None:
        assert (shard_for(job_id, 4), shard_for(job_id, 8)) == (on_4, on_8)

    @pytest.mark.parametrize("shards", [4, 8])
    def test_every_shard_gets_jobs(self, shards: int) -> None:
        assert {shard_for(job_id, shards) for job_id in JOB_IDS} == set(range(shards))

    def test_one_shard_takes_everything(self) -> None:
        assert {shard_for(job_id, 1) for job_id in JOB_IDS} == {0}


class TestStreamFamily:
    def test_names_its_shards_in_order(self) -> None:
        family = StreamFamily("scan:events", 4)

        assert family.streams == (
            "scan:events:0",
            "scan:events:1",
            "scan:events:2",
            "scan:events:3",
        )

    def test_domain_is_the_first_segment_of_the_prefix(self) -> None:
        assert StreamFamily("scan:events", 4).domain == "scan"
        assert StreamFamily("chat:events:v2", 2).domain == "chat"
        assert StreamFamily("plain", 2).domain == "plain"

    def test_dead_letter_stream_is_not_one_of_the_shards(self) -> None:
        family = StreamFamily("scan:events", 4)

        assert family.dead_letter_stream == "scan:events:dlq"
        assert family.dead_letter_stream not in family.streams

    @pytest.mark.parametrize("shards", [4, 8])
    def test_a_job_streams_to_its_md5_shard(self, shards: int) -> None:
        family = StreamFamily("scan:events", shards)

        for job_id in JOB_IDS:
            assert family.stream_for(job_id) == f"scan:events:{md5_shard(job_id, shards)}"
            assert family.stream_for(job_id) in family.streams


class TestFamiliesByStream:
    def test_every_shard_maps_to_its_family_in_order(self) -> None:
        scan, chat = StreamFamily("scan:events", 2), StreamFamily("chat:events", 2, tagged=True)

        by_stream = families_by_stream([scan, chat])

        assert list(by_stream) == [*scan.streams, *chat.streams]
        assert {by_stream[s] for s in scan.streams} == {scan}
        assert {by_stream[s] for s in chat.streams} == {chat}

    def test_no_families_map_no_stream(self) -> None:
        assert families_by_stream([]) == {}


class TestShardOf:
    @pytest.mark.parametrize(
        ("stream", "shard"),
        [("scan:events:0", 0), ("scan:events:3", 3), ("chat:events:12", 12)],
    )
    def test_reads_the_shard_number_at_the_end(self, stream: str, shard: int) -> None:
        assert shard_of(stream) == shard

    def test_is_the_inverse_of_the_family_names(self) -> None:
        family = StreamFamily("scan:events", 8)

        assert [shard_of(stream) for stream in family.streams] == list(range(8))

    @pytest.mark.parametrize(
        "stream",
        [
            "scan:events",
            "scan:events:",
            "scan:events:dlq",
            "scan:events:-1",
            "scan:events:1a",
            "scan:events: 1",
            "scan:events:²",
            "scan:events:٣",
        ],
    )
    def test_a_name_without_a_shard_number_is_refused(self, stream: str) -> None:
        with pytest.raises(InvalidStreamName, match="shard number"):
            shard_of(stream)

    def test_the_error_is_a_domain_error(self) -> None:
        assert issubclass(InvalidStreamName, DomainError)


class TestTaggedShards:
    def test_a_tagged_shard_keeps_its_prefix_and_number_and_gets_a_hash_tag(self) -> None:
        streams = StreamFamily("scan:events", 4, tagged=True).streams

        assert [shard_of(s) for s in streams] == [0, 1, 2, 3]
        assert all(s.startswith("scan:events:{") for s in streams)
        assert len({hash_tag(s) for s in streams}) == 4

    def test_the_plain_layout_keeps_todays_names(self) -> None:
        assert StreamFamily("scan:events", 2).streams == ("scan:events:0", "scan:events:1")

    def test_a_job_goes_to_the_same_shard_number_in_both_layouts(self) -> None:
        plain, tagged = StreamFamily("scan:events", 4), StreamFamily("scan:events", 4, tagged=True)

        for n in range(200):
            job = f"job-{n}"
            assert shard_of(tagged.stream_for(job)) == shard_of(plain.stream_for(job))

    @pytest.mark.parametrize("shards", [1, 2, 3, 4, 8, 16, 64, 1024])
    def test_a_familys_shards_spread_evenly_over_the_slots(self, shards: int) -> None:
        slots = sorted(key_slot(s) for s in StreamFamily("scan:events", shards, True).streams)

        gaps = [b - a for a, b in itertools.pairwise(slots)]
        assert all(gap in (SLOTS // shards, SLOTS // shards + 1) for gap in gaps)

    @pytest.mark.parametrize("families", [("scan:events",), ("scan:events", "chat:events")])
    def test_the_default_shards_sit_within_one_of_the_mean_on_three_equal_masters(
        self, families: tuple[str, ...]
    ) -> None:
        # redis-cli --cluster create gives 3 masters 5461, 5461 and 5462 slots.
        bounds = (5461, 10922, SLOTS)
        per_master = [0, 0, 0]
        for prefix in families:
            for stream in StreamFamily(prefix, 4, tagged=True).streams:
                per_master[next(i for i, end in enumerate(bounds) if key_slot(stream) < end)] += 1

        mean = sum(per_master) / 3
        assert all(abs(count - mean) <= 1 for count in per_master), per_master


class TestKeySlot:
    @pytest.mark.parametrize(
        ("key", "slot"),
        # As CLUSTER KEYSLOT answers.
        [("foo", 12182), ("{user1000}.following", 3443), ("a{}b", 13694), ("{a}{b}", 15495)],
    )
    def test_it_is_redis_clusters_slot(self, key: str, slot: int) -> None:
        assert key_slot(key) == slot

    def test_a_name_without_a_tag_is_tagged_whole_and_a_tagged_one_keeps_its_own(self) -> None:
        assert slot_named("scan:events:0") == "{scan:events:0}"
        assert slot_named("scan:events:{7}:0") == "scan:events:{7}:0"
