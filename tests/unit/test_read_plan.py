"""The read plan: which step comes next, checked on every case and against simulated sources."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from eco_router.adapters.waited_reads import later, past_seen
from eco_router.domain.read_plan import (
    LOOK_BEHIND_AFTER_ENTRIES,
    LOOK_BEHIND_EVERY_S,
    AfterRead,
    BackOff,
    Claim,
    Drained,
    FlushAcks,
    Phase,
    Probe,
    Read,
    ReadResult,
    RouteAgain,
    Shard,
    Situation,
    Step,
    Stop,
    TakePrefetched,
    Wait,
    after_read,
    blocking_ms,
    busy,
    look_behind_due,
    next_step,
)

A, B, C = "scan:events:0", "scan:events:1", "scan:events:2"
BLOCK_MS = 5_000


def situation(*shards: Shard, **overrides: object) -> Situation:
    values: dict[str, object] = {
        "shards": shards,
        "now": 100.0,
        "block_ms": BLOCK_MS,
        "looked_behind_s": 99.9,
    }
    values.update(overrides)
    return Situation(**values)  # type: ignore[arg-type]


def reading(stream: str, token: int = 1, *, quarantined: bool = False) -> Shard:
    return Shard(stream, token, Phase.READING, quarantined)


def taking_over(stream: str, token: int = 1, *, quarantined: bool = False) -> Shard:
    return Shard(stream, token, Phase.TAKING_OVER, quarantined)


def releasing(stream: str, token: int = 1) -> Shard:
    return Shard(stream, token, Phase.RELEASING)


class TestNextStep:
    def test_back_off_comes_before_anything(self) -> None:
        now = situation(taking_over(A), backing_off=True, retrying=True, stopping=True)
        assert next_step(now) == BackOff()

    def test_a_kept_batch_is_routed_again_before_anything_is_read_or_claimed(self) -> None:
        now = situation(taking_over(A), reading(B), retrying=True, prefetched=True)
        assert next_step(now) == RouteAgain()

    def test_a_read_in_flight_is_taken_before_a_new_claim(self) -> None:
        assert next_step(situation(taking_over(A), prefetched=True)) == TakePrefetched()

    def test_stopping_reads_and_claims_nothing_new(self) -> None:
        now = situation(taking_over(A), reading(B), stopping=True, probes_due=(C,))
        assert next_step(now) == Stop()

    def test_stopping_finishes_the_read_in_flight(self) -> None:
        assert next_step(situation(reading(A), stopping=True, prefetched=True)) == TakePrefetched()

    def test_stopping_retries_a_kept_batch_until_the_grace_is_over(self) -> None:
        now = situation(reading(A), stopping=True, retrying=True)
        assert next_step(now) == RouteAgain()
        assert next_step(replace(now, past_grace=True)) == Stop(abandon=True)

    def test_due_quarantined_shards_are_probed_first(self) -> None:
        now = situation(taking_over(A), reading(B), probes_due=(C,))
        assert next_step(now) == Probe((C,))

    def test_a_shard_taken_over_is_claimed_before_any_read(self) -> None:
        assert next_step(situation(reading(A), taking_over(B))) == Claim(B)

    def test_owed_acks_land_before_a_claim(self) -> None:
        assert next_step(situation(taking_over(A), owed_acks=3)) == FlushAcks()

    def test_take_overs_go_in_the_order_the_shards_were_gained(self) -> None:
        assert next_step(situation(taking_over(B), taking_over(A))) == Claim(B)

    def test_a_quarantined_shard_is_neither_claimed_nor_read(self) -> None:
        now = situation(taking_over(A, quarantined=True), reading(B, quarantined=True), reading(C))
        assert next_step(now) == Read({C: 1}, look_behind=False)

    def test_one_read_covers_every_reading_shard_and_no_releasing_one(self) -> None:
        now = situation(reading(A, 3), releasing(B), reading(C, 4))
        assert next_step(now) == Read({A: 3, C: 4}, look_behind=False)

    def test_with_nothing_to_read_owed_acks_land_then_the_router_waits(self) -> None:
        assert next_step(situation(releasing(A), owed_acks=1)) == FlushAcks()
        assert next_step(situation(releasing(A))) == Wait()
        assert next_step(situation()) == Wait()

    def test_after_a_draining_read_the_next_one_blocks_with_the_acks_riding_on_it(
        self,
    ) -> None:
        drained = Drained({A: 1})
        now = situation(reading(A), drained=drained, looked_behind_s=-math.inf, owed_acks=2)
        assert next_step(now) == Read({A: 1}, look_behind=True, block_ms=BLOCK_MS)

    def test_a_drained_read_of_other_shards_or_tokens_does_not_block(self) -> None:
        for drained in (Drained({A: 1}), Drained({B: 2})):
            now = situation(reading(A), reading(B), drained=drained)
            assert next_step(now) == Read({A: 1, B: 1}, look_behind=False)


def every_situation() -> Iterator[Situation]:
    """Every combination of what the plan looks at, on two shards (a third to probe)."""
    phases = [None, *Phase]
    flags = itertools.product([False, True], repeat=7)
    for shard_phases, (quarantine, back, stop, grace, retry, pre, drained) in itertools.product(
        itertools.product(phases, repeat=2), flags
    ):
        shards = tuple(
            Shard(stream, 1, phase, quarantined=quarantine and stream == A)
            for stream, phase in zip((A, B), shard_phases, strict=True)
            if phase is not None
        )
        tokens = {s.stream: 1 for s in shards if s.phase is Phase.READING and not s.quarantined}
        for owed, probes in itertools.product((0, 2), ((), (C,))):
            yield situation(
                *shards,
                backing_off=back,
                stopping=stop,
                past_grace=stop and grace,
                retrying=retry,
                prefetched=pre,
                owed_acks=owed,
                probes_due=probes,
                drained=Drained(tokens) if drained else None,
            )


SITUATIONS = list(every_situation())


def check_rules(now: Situation, step: Step) -> None:
    """Every rule the plan promises, for `step` taken in `now`."""
    if now.backing_off:
        assert step == BackOff()
        return
    if isinstance(step, Claim | Read | Probe | Wait | FlushAcks):
        assert not now.stopping, "nothing new is read or claimed once stopping"
        assert not now.retrying, "batches are routed one at a time"
        assert not now.prefetched
    if isinstance(step, Claim | Read):
        assert not now.probes_due
    if isinstance(step, Claim):
        assert now.owed_acks == 0, "an entry routed but not acked would be claimed again"
        assert step.stream in now.taking_over()
    if isinstance(step, Read):
        assert not now.taking_over(), "take-over first"
        assert dict(step.tokens) == now.reading()
        assert step.block_ms == 0 or now.drained is not None
    if isinstance(step, Wait):
        assert not now.reading(), "a router with shards to read reads them"
        assert now.owed_acks == 0, "owed acks land before a wait"
    if isinstance(step, Stop):
        assert now.stopping
        assert step.abandon == now.retrying
        assert not now.prefetched or now.retrying
    if isinstance(step, RouteAgain):
        assert now.retrying
    if isinstance(step, TakePrefetched):
        assert now.prefetched
        assert not now.retrying


class TestEveryCase:
    def test_the_rules_hold(self) -> None:
        for now in SITUATIONS:
            check_rules(now, next_step(now))

    def test_every_step_kind_is_reached(self) -> None:
        kinds = {type(next_step(now)) for now in SITUATIONS}
        assert kinds == {
            BackOff,
            RouteAgain,
            TakePrefetched,
            Stop,
            Probe,
            FlushAcks,
            Claim,
            Read,
            Wait,
        }


class TestLookBehind:
    def test_after_a_busy_read_and_once_a_second(self) -> None:
        now = situation(reading(A), now=10.0, looked_behind_s=9.5)
        assert not look_behind_due(now)
        assert look_behind_due(replace(now, busy=True))
        assert look_behind_due(replace(now, now=9.5 + LOOK_BEHIND_EVERY_S))

    def test_a_read_is_busy_from_the_threshold_on(self) -> None:
        assert not busy(LOOK_BEHIND_AFTER_ENTRIES - 1)
        assert busy(LOOK_BEHIND_AFTER_ENTRIES)

    @given(
        st.integers(1, 60_000),
        st.none() | st.floats(0, 100),
        st.floats(0, 10),
        st.floats(0, 10),
        st.booleans(),
    )
    def test_a_blocking_read_waits_no_longer_than_the_next_retry_or_look_behind(
        self, block_ms: int, retry_in_s: float | None, now_s: float, looked: float, was_busy: bool
    ) -> None:
        now = situation(
            now=now_s,
            looked_behind_s=looked,
            block_ms=block_ms,
            busy=was_busy,
            retry_in_s=retry_in_s,
        )
        waits = blocking_ms(now)
        assert 1 <= waits <= block_ms
        if retry_in_s is not None:
            assert waits <= max(1, retry_in_s * 1000)
        looking_in_s = looked + LOOK_BEHIND_EVERY_S - now_s
        if looking_in_s > 0 and not was_busy:
            assert waits <= max(1, math.ceil(looking_in_s * 1000))


class TestAfterRead:
    def test_a_read_that_drained_its_shards_makes_the_next_block(self) -> None:
        now = situation(reading(A))
        read = ReadResult({A: 1}, brought=3, drained=True)
        assert after_read(now, read) == AfterRead(drained=Drained({A: 1}))

    def test_behind_a_backlog_the_next_read_starts_while_this_batch_is_routed(self) -> None:
        now = situation(reading(A), reading(B, 2), busy=True)
        read = ReadResult({A: 1}, brought=10, drained=False)
        assert after_read(now, read) == AfterRead(prefetch=Read({A: 1, B: 2}, look_behind=True))

    def test_no_read_starts_while_stopping_or_taking_over(self) -> None:
        read = ReadResult({A: 1}, brought=10, drained=False)
        assert after_read(situation(reading(A), stopping=True), read) == AfterRead()
        assert after_read(situation(reading(A), taking_over(B)), read) == AfterRead()

    def test_an_empty_read_makes_the_next_block(self) -> None:
        read = ReadResult({A: 1}, brought=0, drained=True)
        assert after_read(situation(reading(A)), read) == AfterRead(drained=Drained({A: 1}))

    def test_an_empty_read_of_shards_that_changed_meanwhile_does_not_block(self) -> None:
        read = ReadResult({A: 1}, brought=0, drained=True)
        assert after_read(situation(reading(A), reading(B)), read) == AfterRead()
        assert after_read(situation(reading(A, 2)), read) == AfterRead()
        assert after_read(situation(reading(A), taking_over(B)), read) == AfterRead()
        assert after_read(situation(reading(A)), replace(read, broken=True)) == AfterRead()

    def test_an_empty_read_that_did_not_drain_is_followed_at_once(self) -> None:
        read = ReadResult({A: 1}, brought=0, drained=False)
        assert after_read(situation(reading(A)), read) == AfterRead()


class TestMarks:
    def test_marks_move_past_what_a_wait_saw_that_a_read_did_not_bring(self) -> None:
        assert past_seen({A: "5-0", B: "5-0"}, {A: "7-0", B: "3-0"}) == {A: "7-0", B: "5-0"}

    def test_later_compares_ids_not_text(self) -> None:
        assert later("9-0", "10-0") == "10-0"
        assert later(None, "1-0") == "1-0"
        assert later("2-1", "2-0") == "2-1"


# --------------------------------------------------------------------------- simulation

ME, OLD = "me", "old"
COUNT = 3


@dataclass
class SimShard:
    """A shard of a simulated source: entry ids 1..`appended`, the group's last delivered id,
    who each pending entry is pending at, and the ids routed, by whoever, in routing order."""

    appended: int
    delivered: int
    pending: dict[int, str]
    routed: list[int]


@dataclass
class Sim:
    """One router carrying out the plan against a simulated source, with faults injected."""

    shards: dict[str, SimShard]
    phase: dict[str, Phase] = field(default_factory=dict)
    cursor: dict[str, int] = field(default_factory=dict)
    last_id: dict[str, int] = field(default_factory=dict)
    finishing: set[str] = field(default_factory=set)
    unsettled: list[tuple[str, int]] = field(default_factory=list)
    starts: dict[str, tuple[int, int]] = field(default_factory=dict)
    failed: bool = False
    owed: list[tuple[str, int]] = field(default_factory=list)
    drained: Drained | None = None
    prefetch: tuple[Read, ReadOutcome | None] | None = None
    looked_behind_s: float = -math.inf
    busy: bool = False
    now: float = 0.0
    lose_read: bool = False
    fail_route: bool = False

    def __post_init__(self) -> None:
        for stream in self.shards:
            self.phase[stream] = Phase.TAKING_OVER
            self.cursor[stream] = 0
            self.last_id[stream] = 0

    def situation(self) -> Situation:
        return Situation(
            shards=tuple(Shard(s, 1, p) for s, p in self.phase.items()),
            now=self.now,
            block_ms=BLOCK_MS,
            looked_behind_s=self.looked_behind_s,
            busy=self.busy,
            backing_off=self.failed,
            retrying=bool(self.unsettled),
            prefetched=self.prefetch is not None,
            owed_acks=len(self.owed),
            drained=self.drained,
        )

    def take_over_again(self, streams: object) -> None:
        for stream in streams:  # type: ignore[attr-defined]
            if self.phase[stream] is Phase.READING:
                self.phase[stream] = Phase.TAKING_OVER
                self.cursor[stream] = 0

    def step(self) -> None:
        self.now += 0.1
        step = next_step(self.situation())
        if isinstance(step, BackOff):
            self.failed = False
            return
        batch, starts = self.unsettled, self.starts
        if isinstance(step, FlushAcks):
            self.ack(self.owed)
            self.owed = []
        elif isinstance(step, Claim):
            batch, starts = self.claim(step.stream), {}
        elif isinstance(step, Read | TakePrefetched):
            if isinstance(step, Read):
                self.drained = None
                read, outcome = step, self.read(step)
            else:
                assert self.prefetch is not None
                (read, outcome), self.prefetch = self.prefetch, None
            if outcome is None:  # the reply was lost
                self.take_over_again(read.tokens)
                self.failed = True
                return
            batch, starts = self.take_read(read, outcome)
        if batch:
            self.route(batch, starts)
        if not self.unsettled:
            for stream in self.finishing:
                if self.phase[stream] is Phase.TAKING_OVER:
                    self.phase[stream] = Phase.READING
            self.finishing.clear()

    def ack(self, entries: list[tuple[str, int]]) -> None:
        for stream, entry in entries:
            self.shards[stream].pending.pop(entry, None)

    def claim(self, stream: str) -> list[tuple[str, int]]:
        shard = self.shards[stream]
        if self.cursor[stream] == 0:
            self.last_id[stream] = shard.delivered
        left = sorted(i for i in shard.pending if i > self.cursor[stream])
        page = left[:COUNT]
        for entry in page:
            shard.pending[entry] = ME
        if page:
            self.last_id[stream] = max(self.last_id[stream], page[-1])
        if len(left) > COUNT:
            self.cursor[stream] = page[-1]
        else:
            self.cursor[stream] = 0
            self.finishing.add(stream)
        return [(stream, i) for i in page]

    def read(self, step: Read) -> ReadOutcome | None:
        """What the source does with a read, right when it starts; None: the reply was lost."""
        self.ack(self.owed)
        self.owed = []
        if step.look_behind:
            self.looked_behind_s = self.now
        outcome = ReadOutcome()
        for stream in step.tokens:
            shard, after = self.shards[stream], self.last_id[stream]
            if step.look_behind and any(i > after for i in shard.pending):
                outcome.gaps.add(stream)
                continue
            new = list(range(shard.delivered + 1, min(shard.appended, shard.delivered + COUNT) + 1))
            for entry in new:
                shard.pending[entry] = ME
            shard.delivered = new[-1] if new else shard.delivered
            outcome.entries += [(stream, i) for i in new]
            if new and not step.look_behind:
                outcome.starts[stream] = (after, new[0])
        if all(self.shards[s].delivered == self.shards[s].appended for s in step.tokens):
            outcome.marks = {s: f"{self.shards[s].appended}-0" for s in step.tokens}
        if self.lose_read and outcome.entries:
            self.lose_read = False
            return None
        self.busy = busy(len(outcome.entries))
        for stream, entry in outcome.entries:
            self.last_id[stream] = entry
        return outcome

    def take_read(
        self, read: Read, outcome: ReadOutcome
    ) -> tuple[list[tuple[str, int]], dict[str, tuple[int, int]]]:
        self.take_over_again(outcome.gaps)
        keep = {s for s in read.tokens if self.phase[s] is Phase.READING}
        entries = [(s, i) for s, i in outcome.entries if s in keep]
        starts = {s: start for s, start in outcome.starts.items() if s in keep}
        result = ReadResult(read.tokens, len(entries), bool(outcome.marks))
        follow = after_read(self.situation(), result)
        self.drained = follow.drained
        if follow.prefetch is not None:
            self.prefetch = (follow.prefetch, self.read(follow.prefetch))
        return entries, starts

    def route(self, batch: list[tuple[str, int]], starts: Mapping[str, tuple[int, int]]) -> None:
        """The apply: fails whole (kept for retry), or routes every shard but those with a gap
        between the read's start and its first entry (they stay pending, claimed again)."""
        self.unsettled, self.starts = [], {}
        if self.fail_route:
            self.fail_route = False
            self.unsettled, self.starts, self.failed = batch, dict(starts), True
            return
        gaps = set()
        for stream, (after, first) in starts.items():
            pending = self.shards[stream].pending
            if min(i for i in pending if i > after) != first or pending[first] != ME:
                gaps.add(stream)
        self.take_over_again(gaps)
        for stream, entry in batch:
            if stream not in gaps:
                self.shards[stream].routed.append(entry)
                self.owed.append((stream, entry))


@dataclass
class ReadOutcome:
    entries: list[tuple[str, int]] = field(default_factory=list)
    gaps: set[str] = field(default_factory=set)
    marks: dict[str, str] = field(default_factory=dict)
    starts: dict[str, tuple[int, int]] = field(default_factory=dict)


@st.composite
def starting_shards(draw: st.DrawFn) -> dict[str, SimShard]:
    """Shards as an earlier holder left them: it read `delivered` entries and routed (and
    acked) the first `routed` of them; the rest are pending at it."""
    shards = {}
    for stream in (A, B)[: draw(st.integers(1, 2))]:
        appended = draw(st.integers(0, 12))
        delivered = draw(st.integers(0, appended))
        routed = draw(st.integers(0, delivered))
        pending = dict.fromkeys(range(routed + 1, delivered + 1), OLD)
        shards[stream] = SimShard(appended, delivered, pending, list(range(1, routed + 1)))
    return shards


FAULTS = st.lists(
    st.sampled_from(["step", "step", "step", "append", "lose_read", "fail_route", "old_reads"]),
    max_size=60,
)


class TestEveryEntryRoutedOnceInStreamOrder:
    @settings(max_examples=300, deadline=None)
    @given(starting_shards(), FAULTS, st.data())
    def test_whatever_the_interleaving(
        self, shards: dict[str, SimShard], faults: list[str], data: st.DataObject
    ) -> None:
        sim = Sim(shards)
        for fault in faults:
            stream = data.draw(st.sampled_from(sorted(shards)))
            shard = shards[stream]
            if fault == "step":
                sim.step()
            elif fault == "append":
                shard.appended += data.draw(st.integers(1, 5))
            elif fault == "lose_read":
                sim.lose_read = True
            elif fault == "fail_route":
                sim.fail_route = True
            elif shard.delivered < shard.appended:
                # A router that lost the shard and has not noticed reads on (it routes
                # nothing: its apply is fenced).
                shard.delivered += 1
                shard.pending[shard.delivered] = OLD
        sim.lose_read = sim.fail_route = False
        for _ in range(400):
            sim.step()
        for stream, shard in shards.items():
            assert shard.routed == list(range(1, shard.appended + 1)), stream
            assert sim.phase[stream] is Phase.READING
