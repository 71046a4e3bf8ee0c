"""The shards this router holds: fencing token and phase, shared by the lease keeper and loops."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from eco_router.application.port_values import Delivery
from eco_router.domain.read_plan import Phase, Shard

__all__ = ["HeldShard", "HeldShards", "Phase", "streams_of"]


@dataclass(slots=True)
class HeldShard:
    """One held shard; `cursor` is where the take-over's claim goes on, `last_id` the last
    entry of it this router read or took over (the group's position when the take-over
    began): an entry after it pending elsewhere was read by a router that lost the shard."""

    token: int
    since_ms: int
    acquired_s: float
    phase: Phase = Phase.TAKING_OVER
    cursor: str = "0-0"
    claimed: int = 0
    last_id: str = "0-0"
    again: bool = False  # taken over again after a lost read reply, not from another holder


class HeldShards:
    """What the lease keeper won and the consumer works on.

    The keeper gains, releases and loses shards; the consumer reads only `READING` shards,
    first finishing each gained shard's take-over, and reports what it has in hand (read but
    not settled), so a shard is given up only once drained. `changed` wakes the consumer.
    """

    def __init__(self) -> None:
        self._held: dict[str, HeldShard] = {}
        self._in_hand: Counter[str] = Counter()
        self.changed = asyncio.Event()
        # The read plan's view, made again only when a shard or a quarantine changed: the
        # consumer asks for it before every step.
        self._view: tuple[frozenset[str], tuple[Shard, ...]] | None = None

    def _moved(self) -> None:
        self._view = None
        self.changed.set()

    def __contains__(self, stream: object) -> bool:
        return stream in self._held

    def get(self, stream: str) -> HeldShard | None:
        return self._held.get(stream)

    def tokens(self, phases: Iterable[Phase] = tuple(Phase)) -> dict[str, int]:
        """Stream → fencing token of the shards in `phases`."""
        wanted = set(phases)
        return {s: h.token for s, h in self._held.items() if h.phase in wanted}

    def taking_over(self) -> list[str]:
        return [s for s, h in self._held.items() if h.phase is Phase.TAKING_OVER]

    def gain(self, stream: str, token: int, *, since_ms: int, now_s: float) -> None:
        self._held[stream] = HeldShard(token, since_ms, now_s)
        self._moved()

    def took_over(self, stream: str) -> HeldShard | None:
        """The take-over is complete: new entries may be read."""
        held = self._held.get(stream)
        if held is not None and held.phase is Phase.TAKING_OVER:
            held.phase = Phase.READING
            self._moved()
        return held

    def take_over_again(self, streams: Iterable[str]) -> None:
        """Back to taking over for the reading shards among `streams`: what is pending on
        them (a read whose reply was lost, entries a router read after losing the shard) is
        claimed and routed, in id order, before new entries."""
        for stream in streams:
            held = self._held.get(stream)
            if held is not None and held.phase is Phase.READING:
                held.phase = Phase.TAKING_OVER
                held.cursor = "0-0"
                held.again = True
                self._moved()

    def start_release(self, stream: str) -> None:
        held = self._held.get(stream)
        if held is not None:
            held.phase = Phase.RELEASING
            self._moved()

    def lose(self, stream: str) -> HeldShard | None:
        """Forget the shard (released, or taken by another router)."""
        held = self._held.pop(stream, None)
        if held is not None:
            self._moved()
        return held

    def reading(self) -> dict[str, str]:
        """Stream → last entry id of the shards being read."""
        return {s: h.last_id for s, h in self._held.items() if h.phase is Phase.READING}

    def streams(self) -> list[str]:
        return list(self._held)

    def shards(self, quarantined: frozenset[str]) -> tuple[Shard, ...]:
        """The held shards as the read plan sees them."""
        view = self._view
        if view is None or view[0] != quarantined:
            shards = tuple(
                Shard(s, h.token, h.phase, s in quarantined) for s, h in self._held.items()
            )
            view = self._view = (quarantined, shards)
        return view[1]

    def picked_up(self, streams: Iterable[str]) -> None:
        """Entries of these streams are in hand (a read in flight counts one per stream)."""
        self._in_hand.update(streams)

    def put_down(self, streams: Iterable[str]) -> None:
        """Entries of these streams are settled, dropped or were never there."""
        self._in_hand.subtract(streams)

    def drained(self) -> list[str]:
        """The releasing shards with nothing in hand: safe to give up."""
        return [
            s for s, h in self._held.items() if h.phase is Phase.RELEASING and self._in_hand[s] <= 0
        ]


def streams_of(deliveries: Iterable[Delivery]) -> list[str]:
    return [d.stream for d in deliveries]
