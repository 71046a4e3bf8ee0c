"""How the router reads its shards: the next step, a pure function of what it knows now.

The consumer carries the steps out (`application/consume_loop.py`); every decision of what to
do next is here, so the order guarantees can be checked without a server or an event loop.

- Back-off first: after a failure nothing is read or routed until the pause is over.
- Stop: nothing new is read or claimed; a batch kept for retry is routed again until the
  drain grace is over (then it is left pending), and a read in flight is routed.
- A batch kept in memory after a transient failure is routed again before anything else.
- A read started while the last batch was routed (prefetch) is taken next.
- Quarantined shards whose retry is due are probed before anything is claimed or read.
- Take-over first: a newly held shard's pending entries are claimed before any new entry is
  read. Owed acks land before a claim (a routed entry not acked would be claimed again).
- New entries: one read over every reading, non-quarantined shard. After a read that drained
  them (same shards under the same tokens), the next read blocks until an entry comes.
- A read looks behind every shard after a busy read (`LOOK_BEHIND_AFTER_ENTRIES` entries or
  more) and at least every `LOOK_BEHIND_EVERY_S`; a blocking read waits no longer than the
  next look-behind or quarantine retry is due.
- With nothing to read: owed acks are flushed, then the router waits for a change of held
  shards, stop or a quarantined shard's retry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

# How often a read looks behind every shard it reads, for entries pending after its position.
LOOK_BEHIND_EVERY_S = 1.0
# A read that brought this many entries makes the next one look behind too: its cost per
# event is small then, and the check left to the apply made reads so fast that batches got
# smaller (at 10,000 events/s the streams server spent 20 % more per event).
LOOK_BEHIND_AFTER_ENTRIES = 8


class Phase(Enum):
    """Where a held shard is in its life with this router."""

    TAKING_OVER = "taking over"  # routing what earlier holders left pending, before new entries
    READING = "reading"
    RELEASING = "releasing"  # read no more; given up once nothing of it is in hand


@dataclass(frozen=True, slots=True)
class Shard:
    """A held shard as the plan sees it."""

    stream: str
    token: int
    phase: Phase
    quarantined: bool = False


@dataclass(frozen=True, slots=True)
class Drained:
    """The last read took everything there was of `tokens`' shards."""

    tokens: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Situation:
    """What the router knows when it picks its next step."""

    shards: tuple[Shard, ...]
    now: float
    block_ms: int
    looked_behind_s: float = -math.inf
    busy: bool = False  # the last read brought `LOOK_BEHIND_AFTER_ENTRIES` or more
    stopping: bool = False
    past_grace: bool = False  # stopping, and the drain grace is over
    backing_off: bool = False
    retrying: bool = False  # a batch kept in memory after a transient failure
    prefetched: bool = False  # a read in flight, started while the last batch was routed
    owed_acks: int = 0
    drained: Drained | None = None
    probes_due: tuple[str, ...] = ()
    retry_in_s: float | None = None  # until the next quarantined shard's retry

    def reading(self) -> dict[str, int]:
        """Stream → token of the shards to read: reading and not quarantined."""
        return {
            s.stream: s.token for s in self.shards if s.phase is Phase.READING and not s.quarantined
        }

    def taking_over(self) -> tuple[str, ...]:
        return tuple(
            s.stream for s in self.shards if s.phase is Phase.TAKING_OVER and not s.quarantined
        )


@dataclass(frozen=True, slots=True)
class Stop:
    """End the loop; `abandon`: a batch is left pending (the drain grace is over)."""

    abandon: bool = False


@dataclass(frozen=True, slots=True)
class BackOff:
    """Pause before anything else (bounded by the drain grace when stopping)."""


@dataclass(frozen=True, slots=True)
class RouteAgain:
    """Route the batch kept in memory again."""


@dataclass(frozen=True, slots=True)
class TakePrefetched:
    """Await the read in flight and route what it brought."""


@dataclass(frozen=True, slots=True)
class Probe:
    """Create the group again on these quarantined shards, to see whether they work now."""

    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FlushAcks:
    """Send the owed acks in a round trip of their own."""


@dataclass(frozen=True, slots=True)
class Claim:
    """Claim the next page of what earlier holders left pending on `stream`."""

    stream: str


@dataclass(frozen=True, slots=True)
class Read:
    """Read new entries of `tokens`' shards (owed acks ride along); `block_ms` > 0 waits that
    long for the first entry."""

    tokens: Mapping[str, int]
    look_behind: bool
    block_ms: int = 0


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to read: wait for a change of held shards, stop or a quarantined shard's retry."""


Step = Stop | BackOff | RouteAgain | TakePrefetched | Probe | FlushAcks | Claim | Read | Wait


def next_step(now: Situation) -> Step:
    """The router's next step (the rules are the module's)."""
    if now.backing_off:
        return BackOff()
    if now.stopping:
        if now.retrying:
            return Stop(abandon=True) if now.past_grace else RouteAgain()
        return TakePrefetched() if now.prefetched else Stop()
    if now.retrying:
        return RouteAgain()
    if now.prefetched:
        return TakePrefetched()
    if now.probes_due:
        return Probe(now.probes_due)
    taking_over = now.taking_over()
    if taking_over:
        return FlushAcks() if now.owed_acks else Claim(taking_over[0])
    tokens = now.reading()
    if not tokens:
        return FlushAcks() if now.owed_acks else Wait()
    if now.drained is not None and now.drained.tokens == tokens:
        return Read(tokens, look_behind_due(now), block_ms=blocking_ms(now))
    return Read(tokens, look_behind_due(now))


def look_behind_due(now: Situation) -> bool:
    """Whether a read starting now looks behind every shard it reads (else the apply checks
    the shards it brought entries of)."""
    return now.busy or now.now - now.looked_behind_s >= LOOK_BEHIND_EVERY_S


def blocking_ms(now: Situation) -> int:
    """How long a read that drained its shards last time waits on the server: at most until
    a quarantined shard's retry or the next look behind is due."""
    block_ms = now.block_ms
    if now.retry_in_s is not None:
        block_ms = max(1, min(block_ms, int(now.retry_in_s * 1000)))
    looking_in_s = now.looked_behind_s + LOOK_BEHIND_EVERY_S - now.now
    if looking_in_s > 0 and not now.busy:
        block_ms = max(1, min(block_ms, math.ceil(looking_in_s * 1000)))
    return block_ms


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What a read of `tokens`' shards came back with, as the plan needs it."""

    tokens: Mapping[str, int]
    brought: int  # entries kept of it (those of shards still read under the same token)
    drained: bool  # it took everything there was (no shard gave a full count)
    broken: bool = False  # a shard was refused for good


@dataclass(frozen=True, slots=True)
class AfterRead:
    """What follows a read: the shards it drained, or a read started while its batch is
    routed (its round trip overlaps the apply and the publish)."""

    drained: Drained | None = None
    prefetch: Read | None = None


def after_read(now: Situation, read: ReadResult) -> AfterRead:
    """`now` is the situation once the read's gaps, broken and lost shards are accounted for.

    - A read that brought entries and drained its shards: the next read waits for appends.
    - Else, behind a backlog, the next read starts at once over the shards read now, unless
      stopping or a shard is being taken over (its claim comes first).
    - A read that brought nothing and drained the shards, still read, none broken nor
      taken over: the next one blocks.
    """
    reading = now.reading()
    if read.brought:
        if read.drained:
            return AfterRead(drained=Drained(read.tokens))
        if reading and not now.stopping and not now.taking_over():
            return AfterRead(prefetch=Read(reading, look_behind_due(now)))
        return AfterRead()
    if read.tokens != reading or now.taking_over() or read.broken or not read.drained:
        return AfterRead()
    return AfterRead(drained=Drained(read.tokens))


def busy(entries: int) -> bool:
    """Whether a read that brought `entries` makes the next read look behind."""
    return entries >= LOOK_BEHIND_AFTER_ENTRIES
