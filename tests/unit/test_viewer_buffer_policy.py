"""The viewer buffer's policy, checked against a plain model over random puts and reads."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from eco_router.adapters.feed_queue import ViewerBuffer
from eco_router.domain.sse import GatewayEvent


def event(seq: int, *, terminal: bool) -> GatewayEvent:
    if terminal:
        return GatewayEvent(event_id=seq, stage="done", status="done", data=b"{}")
    return GatewayEvent(event_id=seq, stage="scan", status="running", data=b"{}")


class BufferPolicy(RuleBasedStateMachine):
    """Model: every event put since the last read, in order; the buffer must hold what the
    policy keeps of it, and report a gap exactly when it kept less than that."""

    def __init__(self) -> None:
        super().__init__()
        self.maxsize = 1
        self.buffer = ViewerBuffer(1)
        self.intermediate: list[GatewayEvent] = []
        self.terminal: GatewayEvent | None = None
        self.dropped = 0
        self.offered = 0
        self.seq = 0

    @initialize(maxsize=st.integers(1, 6))
    def create(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.buffer = ViewerBuffer(maxsize)

    @rule(terminal=st.booleans())
    def put(self, terminal: bool) -> None:
        self.seq += 1
        new = event(self.seq, terminal=terminal)
        before = len(self.buffer)
        self.dropped += self.buffer.put(new)
        self.offered += 1
        assert len(self.buffer) <= before + 1
        if terminal:
            self.terminal = new
        else:
            self.intermediate.append(new)

    @rule(reads=st.integers(1, 8))
    def read(self, reads: int) -> None:
        expected = self.kept()
        got = []
        for _ in range(reads):
            item = self.buffer.pop()
            if item is None:
                break
            got.append(item)
        assert got == expected[:reads]
        assert self.buffer.gap == (self.dropped > 0)
        self.buffer.gap = False
        self.dropped = 0
        remaining = expected[len(got) :]
        self.offered = len(remaining)
        self.intermediate = [e for e in remaining if not e.terminal]
        self.terminal = remaining[-1] if remaining and remaining[-1].terminal else None

    def kept(self) -> list[GatewayEvent]:
        """The newest intermediate events that fit next to the last terminal one, then it."""
        room = self.maxsize - (self.terminal is not None)
        newest = self.intermediate[-room:] if room else []
        return newest + ([self.terminal] if self.terminal is not None else [])

    @invariant()
    def bounded(self) -> None:
        assert len(self.buffer) <= self.maxsize

    @invariant()
    def holds_what_the_policy_keeps(self) -> None:
        kept = self.kept()
        assert len(self.buffer) == len(kept)
        # Every event offered since the last read is held or reported dropped (a terminal
        # event replaced by a later one included), and a gap is due exactly when one was.
        assert self.dropped == self.offered - len(kept)
        assert self.buffer.gap == (self.dropped > 0)


BufferPolicy.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestBufferPolicy = BufferPolicy.TestCase
