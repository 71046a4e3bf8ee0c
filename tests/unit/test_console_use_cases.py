"""The operator console's use cases on the in-memory adapters: snapshot, dead letters, jobs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.dead_letter_archive import InMemoryDeadLetterArchive
from eco_router.adapters.memory.dead_letters import InMemoryDeadLetterSink
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.leases import InMemoryLeaseStore
from eco_router.adapters.memory.shard_progress import InMemoryShardProgress
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.console_snapshot import ConsoleSnapshot, ReadConsoleSnapshot
from eco_router.application.dead_letter_listing import DeadLetterFilter, ListDeadLetters
from eco_router.application.domains import UnknownDomain
from eco_router.application.job_lookup import LookUpJob
from eco_router.application.port_values import DeadLetter, Delivery
from eco_router.application.replay_dead_letters import ReplayDeadLetters, SelectionChanged
from eco_router.domain.rejection import RejectReason
from eco_router.domain.streams import StreamFamily
from tests.contracts.factories import encoded
from tests.contracts.state_store import unstamped
from tests.unit.factories import make_fields

SCAN = StreamFamily("scan:events", 2)
CHAT = StreamFamily("chat:events", 1)
FAMILIES = (SCAN, CHAT)
GROUP = "router"
TTL_MS = 4000
WINDOW_MS = 10_000


@dataclass
class Pipeline:
    """In-memory streams, leases and dead letters, as one router process keeps them."""

    clock: ManualClock
    streams: InMemoryStreams
    source: InMemoryEventSource
    leases: InMemoryLeaseStore
    sink: InMemoryDeadLetterSink
    archive: InMemoryDeadLetterArchive
    read_snapshot: ReadConsoleSnapshot

    async def snapshot(self) -> ConsoleSnapshot:
        return await self.read_snapshot()

    def read(self, stream: str, count: int) -> None:
        """The group reads `count` new entries of `stream`, as a router would."""
        self.streams.read_new(GROUP, "router-a", [stream], count)

    async def dead_letter(
        self, stream: str, reason: RejectReason, **fields: str | bytes | int | None
    ) -> str:
        """Append an entry to `stream` and dead-letter it; returns the entry's id."""
        entry_id = self.streams.xadd(stream, make_fields(**fields))
        delivery = Delivery(
            SCAN if stream in SCAN.streams else CHAT,
            stream,
            entry_id,
            dict(self.streams.entries(stream))[entry_id],
            delivery_count=2,
        )
        await self.sink.send([DeadLetter(delivery, reason, f"{reason.value} detail")])
        return entry_id


@pytest.fixture
async def pipeline() -> Pipeline:
    clock = ManualClock()
    streams = InMemoryStreams(clock)
    source = InMemoryEventSource(streams, families=FAMILIES, group=GROUP, consumer="router-a")
    await source.prepare()
    leases = InMemoryLeaseStore(streams.lease_table(GROUP), ttl_ms=TTL_MS)
    archive = InMemoryDeadLetterArchive(streams)
    read = ReadConsoleSnapshot(
        leases=leases,
        source=source,
        progress=InMemoryShardProgress(streams, families=FAMILIES, group=GROUP),
        archive=archive,
        families=FAMILIES,
        group=GROUP,
        rate_window_ms=WINDOW_MS,
    )
    return Pipeline(clock, streams, source, leases, InMemoryDeadLetterSink(streams), archive, read)


def state_store(pipeline: Pipeline) -> InMemoryStateStore:
    return InMemoryStateStore(
        clock=pipeline.clock,
        streams=pipeline.streams,
        group=GROUP,
        state_ttl_s=3600,
        markers_ttl_s=7200,
        history_size=10,
    )


class TestReadConsoleSnapshot:
    async def test_every_shard_of_every_family_is_listed_held_or_not(
        self, pipeline: Pipeline
    ) -> None:
        snapshot = await pipeline.snapshot()

        assert snapshot.group == GROUP
        assert [d.domain for d in snapshot.domains] == ["scan", "chat"]
        assert [s.stream for s in snapshot.domains[0].shards] == list(SCAN.streams)
        assert [s.shard for s in snapshot.domains[0].shards] == [0, 1]
        assert all(s.holder is None and s.token is None for d in snapshot.domains for s in d.shards)
        assert snapshot.routers == ()

    async def test_a_held_shard_shows_its_holder_since_and_fencing_token(
        self, pipeline: Pipeline
    ) -> None:
        await pipeline.leases.heartbeat("router-a", {})
        lease = await pipeline.leases.acquire(SCAN.streams[1], "router-a")
        assert lease is not None
        pipeline.clock.advance(1500)
        await pipeline.leases.heartbeat("router-a", {SCAN.streams[1]: lease.token})

        snapshot = await pipeline.snapshot()

        row = snapshot.domains[0].shards[1]
        assert (row.holder, row.token, row.since_ms) == ("router-a", lease.token, lease.since_ms)
        assert row.lease_expires_in_ms == TTL_MS
        assert snapshot.domains[0].shards[0].holder is None

    async def test_live_routers_are_listed_with_the_shards_they_hold(
        self, pipeline: Pipeline
    ) -> None:
        for router in ("router-b", "router-a"):
            await pipeline.leases.heartbeat(router, {})
        await pipeline.leases.acquire(SCAN.streams[0], "router-b")
        await pipeline.leases.acquire(CHAT.streams[0], "router-b")

        snapshot = await pipeline.snapshot()

        assert [(r.name, r.shards) for r in snapshot.routers] == [
            ("router-a", ()),
            ("router-b", (CHAT.streams[0], SCAN.streams[0])),
        ]

    async def test_lag_and_pending_come_from_the_group_and_add_up_per_family(
        self, pipeline: Pipeline
    ) -> None:
        for _ in range(5):
            pipeline.streams.xadd(SCAN.streams[0], make_fields())
        pipeline.streams.xadd(SCAN.streams[1], make_fields())
        pipeline.read(SCAN.streams[0], 2)

        scan = (await pipeline.snapshot()).domains[0]

        assert [(s.lag, s.pending) for s in scan.shards] == [(3, 2), (1, 0)]
        assert (scan.lag, scan.pending) == (4, 2)

    async def test_the_first_snapshot_has_no_rates(self, pipeline: Pipeline) -> None:
        pipeline.streams.xadd(SCAN.streams[0], make_fields())

        scan = (await pipeline.snapshot()).domains[0]

        assert [(s.added_per_s, s.read_per_s) for s in scan.shards] == [(None, None)] * 2
        assert scan.added_per_s is None

    async def test_rates_are_appends_and_reads_per_second_between_snapshots(
        self, pipeline: Pipeline
    ) -> None:
        await pipeline.snapshot()
        pipeline.clock.advance(2000)
        for _ in range(20):
            pipeline.streams.xadd(SCAN.streams[0], make_fields())
        pipeline.read(SCAN.streams[0], 10)

        scan = (await pipeline.snapshot()).domains[0]

        assert (scan.shards[0].added_per_s, scan.shards[0].read_per_s) == (10.0, 5.0)
        assert (scan.shards[1].added_per_s, scan.shards[1].read_per_s) == (0.0, 0.0)
        assert (scan.added_per_s, scan.read_per_s) == (10.0, 5.0)

    async def test_a_familys_rates_add_up_the_shards_whose_rate_is_known(
        self, pipeline: Pipeline
    ) -> None:
        pipeline.streams.delete_stream(SCAN.streams[1])  # no group there: no counters
        await pipeline.snapshot()
        pipeline.clock.advance(1000)
        for _ in range(3):
            pipeline.streams.xadd(SCAN.streams[0], make_fields())

        scan = (await pipeline.snapshot()).domains[0]

        assert [s.added_per_s for s in scan.shards] == [3.0, None]
        assert (scan.added_per_s, scan.read_per_s) == (3.0, 0.0)

    async def test_rates_span_back_to_the_newest_snapshot_a_window_old(
        self, pipeline: Pipeline
    ) -> None:
        await pipeline.snapshot()  # t=0
        pipeline.clock.advance(WINDOW_MS)
        for _ in range(30):
            pipeline.streams.xadd(SCAN.streams[0], make_fields())
        await pipeline.snapshot()  # t=window: 30 appended since t=0
        pipeline.clock.advance(WINDOW_MS // 2)
        for _ in range(10):
            pipeline.streams.xadd(SCAN.streams[0], make_fields())

        # The t=window snapshot is only half a window old: t=0 is still the base.
        assert (await pipeline.snapshot()).domains[0].shards[0].added_per_s == pytest.approx(
            40 * 1000 / (WINDOW_MS * 1.5)
        )
        pipeline.clock.advance(WINDOW_MS // 2)

        # Now t=window is a window old: it becomes the base and t=0 is forgotten.
        assert (await pipeline.snapshot()).domains[0].shards[0].added_per_s == pytest.approx(
            10 * 1000 / WINDOW_MS
        )

    async def test_a_counter_unknown_at_first_is_measured_from_the_first_snapshot_knowing_it(
        self, pipeline: Pipeline
    ) -> None:
        pipeline.streams.delete_stream(SCAN.streams[0])
        await pipeline.snapshot()  # t=0: no group yet, reads unknown
        pipeline.clock.advance(1000)
        await pipeline.source.prepare()
        for _ in range(4):
            pipeline.streams.xadd(SCAN.streams[0], make_fields())
        await pipeline.snapshot()  # t=1 s: 4 appended, none read
        pipeline.clock.advance(1000)
        pipeline.read(SCAN.streams[0], 4)
        for _ in range(2):
            pipeline.streams.xadd(SCAN.streams[0], make_fields())

        row = (await pipeline.snapshot()).domains[0].shards[0]

        # Over the last second (from t=1 s), not the two since the first snapshot.
        assert (row.added_per_s, row.read_per_s) == (2.0, 4.0)

    async def test_after_a_long_quiet_spell_old_snapshots_are_forgotten(
        self, pipeline: Pipeline
    ) -> None:
        await pipeline.snapshot()
        pipeline.clock.advance(ReadConsoleSnapshot.MAX_BASE_AGE_WINDOWS * WINDOW_MS + 1)
        pipeline.streams.xadd(SCAN.streams[0], make_fields())

        assert (await pipeline.snapshot()).domains[0].shards[0].added_per_s is None

    async def test_counters_that_went_back_give_no_rate(self, pipeline: Pipeline) -> None:
        pipeline.streams.xadd(SCAN.streams[0], make_fields())
        await pipeline.snapshot()
        pipeline.clock.advance(2000)
        pipeline.streams.delete_stream(SCAN.streams[0])
        await pipeline.source.prepare()

        assert (await pipeline.snapshot()).domains[0].shards[0].added_per_s is None

    async def test_dead_letters_are_counted_per_family_with_the_newest_id(
        self, pipeline: Pipeline
    ) -> None:
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        await pipeline.dead_letter(SCAN.streams[1], RejectReason.MISSING_JOB_ID, job_id=None)

        scan, chat = (await pipeline.snapshot()).domains

        newest = pipeline.streams.entries(SCAN.dead_letter_stream)[-1][0]
        assert (scan.dead_letters, scan.newest_dead_letter) == (2, newest)
        assert (chat.dead_letters, chat.newest_dead_letter) == (0, None)


class TestListDeadLetters:
    async def test_every_family_is_listed_oldest_first_with_its_total(
        self, pipeline: Pipeline
    ) -> None:
        first = await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        second = await pipeline.dead_letter(SCAN.streams[1], RejectReason.MISSING_SEQ, seq=None)
        await pipeline.dead_letter(CHAT.streams[0], RejectReason.MISSING_SEQ, seq=None)

        scan, chat = await ListDeadLetters(archive=pipeline.archive, families=FAMILIES)()

        assert (scan.domain, scan.total, chat.domain, chat.total) == ("scan", 2, "chat", 1)
        assert [letter.entry_id for letter in scan.letters] == [first, second]
        assert scan.letters[0].fields[b"seq"] == b"x"

    async def test_a_reason_filter_keeps_that_reason_only(self, pipeline: Pipeline) -> None:
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        kept = await pipeline.dead_letter(SCAN.streams[0], RejectReason.MISSING_SEQ, seq=None)

        (scan,) = await ListDeadLetters(archive=pipeline.archive, families=FAMILIES)(
            "scan", matching=DeadLetterFilter(reason="missing_seq")
        )

        assert [letter.entry_id for letter in scan.letters] == [kept]
        assert scan.total == 2

    async def test_a_text_filter_finds_field_values_ignoring_case(self, pipeline: Pipeline) -> None:
        kept = await pipeline.dead_letter(
            SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, job_id="Invoice-42", seq="x"
        )
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="y")

        (scan,) = await ListDeadLetters(archive=pipeline.archive, families=FAMILIES)(
            "scan", matching=DeadLetterFilter(text="invoice-42")
        )

        assert [letter.entry_id for letter in scan.letters] == [kept]

    async def test_count_bounds_the_letters_returned(self, pipeline: Pipeline) -> None:
        for _ in range(3):
            await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")

        (scan,) = await ListDeadLetters(archive=pipeline.archive, families=FAMILIES)(
            "scan", count=2
        )

        assert (len(scan.letters), scan.total, scan.scanned) == (2, 3, 3)

    async def test_matching_counts_every_match_scanned_not_only_those_returned(
        self, pipeline: Pipeline
    ) -> None:
        for _ in range(3):
            await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.MISSING_SEQ, seq=None)

        (scan,) = await ListDeadLetters(archive=pipeline.archive, families=FAMILIES)(
            "scan", matching=DeadLetterFilter(reason="seq_not_integer"), count=2
        )

        assert (len(scan.letters), scan.matching, scan.total) == (2, 3, 4)

    async def test_an_unknown_domain_is_refused_naming_the_known_ones(
        self, pipeline: Pipeline
    ) -> None:
        listing = ListDeadLetters(archive=pipeline.archive, families=FAMILIES)

        with pytest.raises(UnknownDomain, match="configured: scan, chat"):
            await listing("billing")


class TestReplayDeadLetters:
    async def test_a_letter_goes_back_to_its_stream_byte_for_byte_and_leaves_the_archive(
        self, pipeline: Pipeline
    ) -> None:
        await pipeline.dead_letter(SCAN.streams[1], RejectReason.SEQ_NOT_INTEGER, seq=b"\xff")
        (letter,) = await pipeline.archive.oldest(SCAN)
        replay = ReplayDeadLetters(archive=pipeline.archive, families=FAMILIES)

        (replayed,) = await replay("scan", ids=[letter.dlq_id])

        assert (replayed.dlq_id, replayed.stream) == (letter.dlq_id, SCAN.streams[1])
        assert dict(pipeline.streams.entries(SCAN.streams[1]))[replayed.new_id] == letter.fields
        assert await pipeline.archive.oldest(SCAN) == []

    async def test_an_unknown_id_replays_nothing_and_names_the_id(self, pipeline: Pipeline) -> None:
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        (letter,) = await pipeline.archive.oldest(SCAN)
        replay = ReplayDeadLetters(archive=pipeline.archive, families=FAMILIES)

        with pytest.raises(LookupError, match="no dead letter 1-1 "):
            await replay("scan", ids=[letter.dlq_id, "1-1"])

        assert [x.dlq_id for x in await pipeline.archive.oldest(SCAN)] == [letter.dlq_id]

    async def test_all_matching_replays_only_the_letters_the_filter_keeps(
        self, pipeline: Pipeline
    ) -> None:
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.MISSING_SEQ, seq=None)
        await pipeline.dead_letter(SCAN.streams[1], RejectReason.MISSING_SEQ, seq=None)
        replay = ReplayDeadLetters(archive=pipeline.archive, families=FAMILIES)

        replayed = await replay("scan", matching=DeadLetterFilter(reason="missing_seq"))

        assert len(replayed) == 2
        assert [x.reason for x in await pipeline.archive.oldest(SCAN)] == ["seq_not_integer"]

    async def test_all_matching_with_the_confirmed_count_replays_that_many(
        self, pipeline: Pipeline
    ) -> None:
        for _ in range(3):
            await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        replay = ReplayDeadLetters(archive=pipeline.archive, families=FAMILIES)

        replayed = await replay("scan", matching=DeadLetterFilter(), expected=3)

        assert len(replayed) == 3

    async def test_all_matching_when_more_match_than_confirmed_replays_nothing(
        self, pipeline: Pipeline
    ) -> None:
        for _ in range(3):
            await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        replay = ReplayDeadLetters(archive=pipeline.archive, families=FAMILIES)

        with pytest.raises(SelectionChanged, match="3 dead letters of scan match now, not the 2"):
            await replay("scan", matching=DeadLetterFilter(), expected=2)

        assert len(await pipeline.archive.oldest(SCAN)) == 3

    async def test_a_filter_matching_nothing_replays_nothing(self, pipeline: Pipeline) -> None:
        await pipeline.dead_letter(SCAN.streams[0], RejectReason.SEQ_NOT_INTEGER, seq="x")
        replay = ReplayDeadLetters(archive=pipeline.archive, families=FAMILIES)

        assert await replay("scan", matching=DeadLetterFilter(reason="missing_seq")) == []
        assert len(await pipeline.archive.oldest(SCAN)) == 1

    @pytest.mark.parametrize(
        "choice",
        [{}, {"ids": ["1-1"], "matching": DeadLetterFilter()}, {"ids": []}],
        ids=["neither", "both", "no-ids"],
    )
    async def test_ids_or_a_filter_must_be_given(
        self, pipeline: Pipeline, choice: dict[str, object]
    ) -> None:
        replay = ReplayDeadLetters(archive=pipeline.archive, families=FAMILIES)

        with pytest.raises(ValueError, match="id"):
            await replay("scan", **choice)  # type: ignore[arg-type]


class TestLookUpJob:
    async def test_a_job_shows_its_state_and_history(self, pipeline: Pipeline) -> None:
        store = state_store(pipeline)
        events = [encoded(seq=1), encoded(seq=2, status="completed")]
        lease = await pipeline.leases.acquire("scan:events:0", "router-a")
        assert lease is not None
        await store.apply(events, {"scan:events:0": lease.token})

        view = unstamped(await LookUpJob(store=store, families=FAMILIES)("scan", "job-1"))

        assert view.state == events[-1].payload
        assert view.history == [e.payload for e in events]

    async def test_an_unknown_job_has_no_state(self, pipeline: Pipeline) -> None:
        store = state_store(pipeline)

        view = await LookUpJob(store=store, families=FAMILIES)("scan", "nobody")

        assert (view.state, view.history) == (None, [])

    async def test_a_malformed_job_id_is_refused(self, pipeline: Pipeline) -> None:
        look_up = LookUpJob(store=state_store(pipeline), families=FAMILIES)

        with pytest.raises(ValueError, match="job_id"):
            await look_up("scan", "a b")

    async def test_an_unknown_domain_is_refused(self, pipeline: Pipeline) -> None:
        look_up = LookUpJob(store=state_store(pipeline), families=FAMILIES)

        with pytest.raises(UnknownDomain):
            await look_up("billing", "job-1")
