"""The `StateStore` contract: every branch of judging, state, history and its trim."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import pytest

from eco_router.application.port_values import Applied, EncodedEvent, JobView, ReadStart
from eco_router.application.ports import StateStore
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES, JobText, TextRun, stamped
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
from tests.contracts.factories import ContractFamilies, entry_id

HISTORY_SIZE = 3
# The fields a store puts first in each payload it keeps (`domain.text.stamp`).
_STAMP = re.compile(
    rb'^\{"event_id":\d+,("prev_event_id":\d+,)?("restart":true,)?("text_check":\{[^}]*\},)?'
)


def text_check(text: bytes, *, truncated: bool) -> bytes:
    """The `text_check` field of a terminal event's stamp for a job whose text is `text`."""
    return b'"text_check":{"bytes":%d,"sha1":"%s","truncated":%s},' % (
        len(text),
        hashlib.sha1(text, usedforsecurity=False).hexdigest().encode(),
        b"true" if truncated else b"false",
    )


def unstamped(view: JobView) -> JobView:
    """`view` with the router's fields taken out of its payloads, as they were encoded."""

    def strip(payload: bytes) -> bytes:
        stripped = _STAMP.sub(b"{", payload)
        assert stripped != payload, f"no event id in {payload[:80]!r}"
        return stripped

    return JobView(
        None if view.state is None else strip(view.state),
        [strip(p) for p in view.history],
        view.text_last_id,
        view.text_written_ms,
    )


class StateStoreContract(ContractFamilies):
    """Every `StateStore` adapter, created empty with a history of `HISTORY_SIZE` payloads.

    Subclasses wire a backend and implement `make_store`. Scan events go to `scan_0`, the
    shard of every scan job here (job-1, job-a, job-b) as a producer routes them: a store on
    tagged shards finds a job's keys through its shard. Tokens are chat job-1's, on `chat_0`.
    """

    @property
    def fence(self) -> dict[str, int]:
        """The fencing tokens the tests' router holds its shards with (each shard's epoch at
        start)."""
        return {self.scan_0: 1, self.chat_0: 1}

    def raw_sized(self, seq: int, size: int) -> EncodedEvent:
        """Event `seq` of job-1 with a payload of exactly `size` bytes (what the store keeps)."""
        event = self.encoded(seq=seq, stream_id=entry_id(seq)).event
        return EncodedEvent(event, b'{"p":"' + f"{seq}:".encode().ljust(size - 8, b"x") + b'"}')

    def token(
        self, seq: int, content: str, *, attempt: int = 0, node: str | None = None, **overrides: Any
    ) -> EncodedEvent:
        """Token `seq` of chat job-1, from entry `entry_id(seq)` unless overridden."""
        extra = {"content": content} | ({"node": node} if node is not None else {})
        fields = {"stream_id": entry_id(seq)} | overrides
        return self.chat_event(seq, stage="token", attempt=attempt, extra=extra, **fields)

    def chat_event(self, seq: int, **overrides: Any) -> EncodedEvent:
        """Stage event `seq` of chat job-1, from entry `entry_id(seq)` unless overridden."""
        fields = {"domain": "chat", "stream": self.chat_0, "stream_id": entry_id(seq)}
        return self.encoded(**(fields | {"seq": seq} | overrides))

    async def make_store(
        self,
        *,
        history_size: int = HISTORY_SIZE,
        history_max_bytes: int = 1 << 20,
        text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES,
    ) -> StateStore:
        """An empty store over the class's `families` with long TTLs (nothing expires during
        a test)."""
        raise NotImplementedError

    async def set_epoch(self, stream: str, token: int) -> None:
        """Set the shard's fencing epoch, as the lease store does when a router takes it."""
        raise NotImplementedError

    async def append_and_read(self, stream: str, consumer: str) -> str:
        """Append an entry to `stream` and read it into the store's group as `consumer` (the
        group created at the start first, if need be); its id."""
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    async def _tokens(self, _backend: None) -> None:
        for stream, token in self.fence.items():
            await self.set_epoch(stream, token)

    async def apply_stamped(self, store: StateStore, events: Sequence[EncodedEvent]) -> Applied:
        """Apply as the holder of every shard; no shard may be fenced."""
        applied = await store.apply(events, self.fence)
        assert applied.fenced == frozenset()
        return applied

    async def apply(
        self, store: StateStore, events: Sequence[EncodedEvent]
    ) -> list[Judgement | None]:
        return (await self.apply_stamped(store, events)).judgements

    async def test_a_read_whose_first_entry_comes_after_one_pending_elsewhere_is_a_gap(
        self,
    ) -> None:
        store = await self.make_store()
        taken_by_another = await self.append_and_read(self.scan_0, "another")
        first = await self.append_and_read(self.scan_0, "me")
        event = self.encoded(seq=1, stream_id=first)

        gap = await store.apply([event], self.fence, {self.scan_0: ReadStart("me", "0-0", first)})
        in_order = await store.apply(
            [event], self.fence, {self.scan_0: ReadStart("me", taken_by_another, first)}
        )

        assert (gap.gaps, gap.judgements) == ({self.scan_0}, [None])
        assert (in_order.gaps, in_order.judgements) == (frozenset(), [NEW_APPLY])

    async def test_a_read_whose_first_entry_comes_after_one_it_took_unseen_is_a_gap(
        self,
    ) -> None:
        store = await self.make_store()
        await self.append_and_read(self.scan_0, "me")
        first = await self.append_and_read(self.scan_0, "me")

        applied = await store.apply(
            [self.encoded(seq=1, stream_id=first)],
            self.fence,
            {self.scan_0: ReadStart("me", "0-0", first)},
        )

        assert (applied.gaps, applied.judgements) == ({self.scan_0}, [None])

    async def test_a_new_event_is_applied_to_state_and_history(self) -> None:
        store = await self.make_store()
        event = self.encoded(seq=1, stream_id=entry_id(1))

        judgements = await self.apply(store, [event])

        assert judgements == [NEW_APPLY]
        assert unstamped(await store.view("scan", "job-1")) == JobView(
            event.payload, [event.payload]
        )

    async def test_the_same_entry_again_is_republished_without_being_applied_twice(
        self,
    ) -> None:
        store = await self.make_store()
        first = self.encoded(seq=1, stream_id=entry_id(1))
        second = self.encoded(seq=2, stream_id=entry_id(2))
        await self.apply(store, [first, second])

        judgements = await self.apply(store, [first])

        assert judgements == [NEW_REPUBLISH]
        assert unstamped(await store.view("scan", "job-1")) == JobView(
            second.payload, [first.payload, second.payload]
        )

    async def test_another_entry_with_an_applied_seq_is_a_duplicate(self) -> None:
        store = await self.make_store()
        held = [await self.append_and_read(self.scan_0, "me") for _ in range(2)]
        original = self.encoded(seq=1, stream_id=held[0], stage="queued")
        newest = self.encoded(seq=2, stream_id=held[1], stage="scanning")
        await self.apply(store, [original, newest])

        judgements = await self.apply(
            store,
            [
                self.encoded(seq=2, stream_id=entry_id(3), stage="copy"),
                self.encoded(seq=1, stream_id=entry_id(4), stage="copy"),
            ],
        )

        assert judgements == [DUPLICATE, DUPLICATE]
        assert unstamped(await store.view("scan", "job-1")) == JobView(
            newest.payload, [original.payload, newest.payload]
        )

    async def test_an_entry_in_place_of_one_gone_from_the_stream_is_published_and_marked(
        self,
    ) -> None:
        # As after a failover: the state write reached the promoted master, the entry that
        # made it (read from the demoted one) did not, and its publish never happened.
        store = await self.make_store()
        first = await self.append_and_read(self.scan_0, "me")
        ms, _, n = first.partition("-")
        # After the stream's first entry, never in it, never deleted.
        gone = self.encoded(seq=1, stream_id=f"{ms}-{int(n) + 1000}", stage="queued")
        await self.apply(store, [gone])
        retried = self.encoded(
            seq=1, stream_id=await self.append_and_read(self.scan_0, "me"), stage="queued"
        )
        again = self.encoded(seq=1, stream_id=entry_id(10**12), stage="queued")

        assert await self.apply(store, [retried]) == [NEW_IN_PLACE_OF_GONE]
        # The retried entry holds the marker now: its own redelivery is published again, a
        # third entry is a duplicate of it.
        assert await self.apply(store, [retried, again]) == [NEW_REPUBLISH, DUPLICATE]
        assert unstamped(await store.view("scan", "job-1")) == JobView(gone.payload, [gone.payload])

    async def test_a_lower_seq_never_applied_is_stale_and_leaves_the_state_alone(self) -> None:
        store = await self.make_store()
        newest = self.encoded(seq=5, stream_id=entry_id(5))
        await self.apply(store, [newest])

        judgements = await self.apply(
            store, [self.encoded(seq=4, stream_id=entry_id(4), stage="late")]
        )

        assert judgements == [STALE]
        assert unstamped(await store.view("scan", "job-1")) == JobView(
            newest.payload, [newest.payload]
        )

    async def test_seq_zero_is_a_valid_first_seq(self) -> None:
        store = await self.make_store()
        first = self.encoded(seq=0, stream_id=await self.append_and_read(self.scan_0, "me"))

        assert await self.apply(store, [first]) == [NEW_APPLY]
        assert await self.apply(store, [self.encoded(seq=0, stream_id=entry_id(2))]) == [DUPLICATE]
        assert unstamped(await store.view("scan", "job-1")) == JobView(
            first.payload, [first.payload]
        )

    async def test_a_batch_of_one_job_is_judged_in_the_given_order(self) -> None:
        store = await self.make_store()
        one, two, three = (self.encoded(seq=n, stream_id=entry_id(n)) for n in (1, 2, 3))
        late = self.encoded(seq=2, stream_id=entry_id(9), stage="late")
        repeated = self.encoded(seq=4, stream_id=entry_id(4))

        judgements = await self.apply(store, [one, three, two, late, repeated, repeated])

        assert judgements == [NEW_APPLY, NEW_APPLY, STALE, STALE, NEW_APPLY, NEW_REPUBLISH]
        assert unstamped(await store.view("scan", "job-1")) == JobView(
            repeated.payload, [one.payload, three.payload, repeated.payload]
        )

    async def test_a_batch_of_several_jobs_keeps_each_jobs_state_apart(self) -> None:
        store = await self.make_store()
        a1 = self.encoded(job_id="job-a", seq=1, stream_id=entry_id(1))
        b1 = self.encoded(job_id="job-b", seq=1, stream_id=entry_id(2))
        a2 = self.encoded(job_id="job-a", seq=2, stream_id=entry_id(3))
        b_stale = self.encoded(job_id="job-b", seq=0, stream_id=entry_id(4))
        chat_a = self.encoded(domain="chat", stream=self.chat_0, job_id="job-a", seq=1)

        judgements = await self.apply(store, [a1, b1, a2, b_stale, chat_a])

        assert judgements == [NEW_APPLY, NEW_APPLY, NEW_APPLY, STALE, NEW_APPLY]
        assert unstamped(await store.view("scan", "job-a")) == JobView(
            a2.payload, [a1.payload, a2.payload]
        )
        assert unstamped(await store.view("scan", "job-b")) == JobView(b1.payload, [b1.payload])
        assert unstamped(await store.view("chat", "job-a")) == JobView(
            chat_a.payload, [chat_a.payload]
        )

    async def test_history_keeps_only_the_newest_payloads_in_seq_order(self) -> None:
        store = await self.make_store(history_size=HISTORY_SIZE)
        events = [self.encoded(seq=n, stream_id=entry_id(n)) for n in range(1, 6)]
        await self.apply(store, events[:4])

        await self.apply(store, events[4:])

        view = unstamped(await store.view("scan", "job-1"))
        assert view.history == [e.payload for e in events[-HISTORY_SIZE:]]
        assert view.state == events[-1].payload

    async def test_history_keeps_only_the_newest_payloads_within_its_byte_cap(self) -> None:
        store = await self.make_store(history_size=100, history_max_bytes=10_000)
        events = [self.raw_sized(n, 3000) for n in range(1, 6)]
        await self.apply(store, events[:2])
        assert unstamped(await store.view("scan", "job-1")).history == [
            e.payload for e in events[:2]
        ]

        await self.apply(store, events[2:])

        # 3 x 3000 bytes fit in 10,000; a fourth would not.
        view = unstamped(await store.view("scan", "job-1"))
        assert view.history == [e.payload for e in events[2:]]
        assert view.state == events[-1].payload

    async def test_the_byte_cap_counts_what_was_trimmed_by_count_too(self) -> None:
        store = await self.make_store(history_size=2, history_max_bytes=5000)
        await self.apply(
            store, [self.raw_sized(1, 2000), self.raw_sized(2, 2000), self.raw_sized(3, 2000)]
        )
        small = [self.raw_sized(4, 500), self.raw_sized(5, 500)]

        await self.apply(store, small)

        # Had the count trim not been counted, 6000 bytes would seem held and 5 alone kept.
        assert unstamped(await store.view("scan", "job-1")).history == [e.payload for e in small]

    async def test_the_newest_event_stays_in_the_history_even_above_the_byte_cap(self) -> None:
        store = await self.make_store(history_size=100, history_max_bytes=1000)
        await self.apply(store, [self.raw_sized(1, 400)])
        huge = self.raw_sized(2, 3000)

        await self.apply(store, [huge])

        assert unstamped(await store.view("scan", "job-1")) == JobView(huge.payload, [huge.payload])

    async def test_the_view_of_an_unknown_job_is_empty(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.encoded(job_id="job-1")])

        assert unstamped(await store.view("scan", "job-2")) == JobView(None, [])
        assert unstamped(await store.view("chat", "job-1")) == JobView(None, [])

    async def test_an_empty_batch_gets_no_judgements(self) -> None:
        store = await self.make_store()

        assert await self.apply(store, []) == []

    # fencing

    async def test_a_shard_whose_token_moved_on_is_not_touched(self) -> None:
        store = await self.make_store()
        before = self.encoded(seq=1, stream_id=entry_id(1))
        await self.apply(store, [before])
        await self.set_epoch(self.scan_0, 2)  # another router took the shard
        chat = self.encoded(domain="chat", stream=self.chat_0, seq=1, stream_id=entry_id(2))

        applied = await store.apply(
            [self.encoded(seq=2, stream_id=entry_id(3)), chat], {self.scan_0: 1, self.chat_0: 1}
        )

        assert applied.fenced == {self.scan_0}
        assert applied.judgements == [None, NEW_APPLY]
        assert unstamped(await store.view("scan", "job-1")) == JobView(
            before.payload, [before.payload]
        )
        assert unstamped(await store.view("chat", "job-1")) == JobView(chat.payload, [chat.payload])

    async def test_the_new_token_writes(self) -> None:
        store = await self.make_store()
        await self.set_epoch(self.scan_0, 2)
        event = self.encoded(seq=1, stream_id=entry_id(1))

        applied = await store.apply([event], {self.scan_0: 2})

        assert applied.fenced == frozenset()
        assert applied.judgements == [NEW_APPLY]

    async def test_a_shard_without_events_is_checked_too(self) -> None:
        store = await self.make_store()
        await self.set_epoch(self.chat_0, 7)

        applied = await store.apply([], {self.scan_0: 1, self.chat_0: 1})

        assert applied.fenced == {self.chat_0}
        assert applied.judgements == []

    # tokens

    async def test_a_stage_event_after_tokens_numbered_higher_is_new(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.chat_event(1), self.token(1001, "a"), self.token(1002, "b")])
        thinking = self.chat_event(2, stage="thinking")

        assert await self.apply(store, [thinking]) == [NEW_APPLY]
        assert unstamped(await store.view("chat", "job-1")).state == thinking.payload

    async def test_a_repeated_token_is_a_duplicate_and_is_not_appended_twice(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.token(1001, "Hel"), self.token(1002, "lo")])

        applied = await self.apply_stamped(
            store, [self.token(1002, "lo"), self.token(1001, "Hel", stream_id=entry_id(99))]
        )

        assert (applied.judgements, applied.stamps) == ([DUPLICATE] * 2, [None] * 2)
        text = await store.text("chat", "job-1")
        assert text is not None
        assert (text.text, text.last_seq) == (b"Hello", 1002)

    async def test_a_newer_attempt_restarts_the_text(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.token(1001, "old "), self.token(1002, "text")])

        applied = await self.apply_stamped(
            store,
            [
                self.token(1001, "new", attempt=1, stream_id=entry_id(11)),
                self.token(1002, " text", attempt=1, stream_id=entry_id(12)),
            ],
        )

        assert applied.judgements == [NEW_RESTART, NEW_APPLY]
        # The job's one sequence of ids goes on past the old attempt's.
        assert applied.stamps == [
            b'"event_id":1003,"prev_event_id":1002,"restart":true,',
            b'"event_id":1004,"prev_event_id":1003,',
        ]
        assert await store.text("chat", "job-1") == JobText(
            b"new text", last_id=1004, last_seq=1002, attempt=1
        )

    async def test_a_late_token_of_an_older_attempt_is_stale(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.token(1001, "new", attempt=1)])

        applied = await self.apply_stamped(store, [self.token(1002, "old", attempt=0)])

        assert (applied.judgements, applied.stamps) == ([STALE], [None])
        assert await store.text("chat", "job-1") == JobText(
            b"new", last_id=1001, last_seq=1001, attempt=1
        )

    async def test_the_token_that_does_not_fit_fills_the_text_and_none_goes_in_after_it(
        self,
    ) -> None:
        store = await self.make_store(text_max_bytes=10)
        await self.apply(store, [self.token(1001, "12345"), self.token(1002, "6789")])
        done = self.chat_event(2, stage="done", status="done")

        applied = await self.apply_stamped(
            store, [self.token(1003, "ab"), self.token(1004, "c"), done]
        )

        assert applied.judgements == [TEXT_FILLED, TEXT_FULL, NEW_APPLY]
        assert applied.stamps == [
            None,
            None,
            b'"event_id":1003,"prev_event_id":1002,' + text_check(b"123456789", truncated=True),
        ]
        assert await store.text("chat", "job-1") == JobText(
            b"123456789", last_id=1002, last_seq=1002, attempt=0, full=True
        )

    async def test_a_newer_attempt_whose_first_token_does_not_fit_leaves_no_text(self) -> None:
        store = await self.make_store(text_max_bytes=10)
        await self.apply(store, [self.token(1001, "old")])
        done = self.chat_event(2, stage="done", status="done")

        applied = await self.apply_stamped(
            store,
            [self.token(1001, "x" * 11, attempt=1, stream_id=entry_id(11)), done],
        )

        assert applied.judgements == [
            Judgement(Verdict.TEXT_FULL, restarts=True, fills=True),
            NEW_APPLY,
        ]
        assert applied.stamps[1] == b'"event_id":1002,"prev_event_id":1001,' + text_check(
            b"", truncated=True
        )
        assert await store.text("chat", "job-1") is None
        view = await store.view("chat", "job-1")
        assert (view.text_last_id, view.text_written_ms) == (None, None)

    async def test_a_first_token_that_does_not_fit_leaves_the_text_full_for_later_batches(
        self,
    ) -> None:
        store = await self.make_store(text_max_bytes=4)
        await self.apply(store, [self.token(1001, "12345")])

        later = await self.apply(store, [self.token(1002, "a")])

        assert later == [TEXT_FULL]

    async def test_a_node_run_ends_where_a_token_without_a_node_comes_and_an_empty_one_leaves_none(
        self,
    ) -> None:
        store = await self.make_store()
        await self.apply(
            store,
            [
                self.token(1001, "", node="plan"),
                self.token(1002, "a", node="act"),
                self.token(1003, "", node=None),
                self.token(1004, "b", node="act"),
            ],
        )

        text = await store.text("chat", "job-1")

        assert text is not None
        assert text.runs == (TextRun("act", 0, 1), TextRun("act", 1, 2))

    async def test_the_text_is_read_with_its_last_token_its_attempt_and_each_nodes_runs(
        self,
    ) -> None:
        store = await self.make_store()
        # Attempt 2 is the first seen: its first token does not restart anything.
        first = [
            self.token(1001, "Pl", attempt=2, node="plan"),
            self.token(1002, "an ", attempt=2, node="plan"),
            self.chat_event(2, stage="thinking"),
        ]
        then = [
            self.token(1003, "é✓", attempt=2, node="act"),
            self.token(1004, " more", attempt=2, node="plan"),
            self.token(1005, "!", attempt=2),
        ]

        assert await self.apply(store, first) == [NEW_APPLY] * 3
        assert await self.apply(store, then) == [NEW_APPLY] * 3

        text = await store.text("chat", "job-1")
        # The stage event took id 1003: the tokens after it are numbered on from there.
        assert text == JobText(
            "Plan é✓ more!".encode(),
            last_id=1006,
            last_seq=1005,
            attempt=2,
            runs=(TextRun("plan", 0, 5), TextRun("act", 5, 10), TextRun("plan", 10, 15)),
        )
        assert text.by_node() == {"plan": "Plan  more", "act": "é✓"}

    async def test_a_job_without_tokens_has_no_text(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.chat_event(1)])

        assert await store.text("chat", "job-1") is None
        assert await store.text("chat", "job-2") is None

    async def test_the_view_gives_the_id_and_write_time_of_the_texts_last_token(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.chat_event(1)])
        before = await store.view("chat", "job-1")
        first = self.token(1001, "a", stream_id="1700000000123-0")
        last = self.token(1002, "b", stream_id="1700000000456-3")

        await self.apply(store, [first, last, self.chat_event(2)])

        # The stage event after the tokens took id 1003: the view names the last token's.
        view = await store.view("chat", "job-1")
        assert (before.text_last_id, before.text_written_ms) == (None, None)
        assert (view.text_last_id, view.text_written_ms) == (1002, 1700000000456)

    # the end ends the text: a token written after the job's end changes nothing

    def hello_world(self) -> list[EncodedEvent]:
        """The issue's job up to its end: queued, "Hello world" in three tokens, then done
        (ids 10, 1001-1003, 1004)."""
        return [
            self.chat_event(10, stage="queued", status="started"),
            self.token(1001, "Hello"),
            self.token(1002, " "),
            self.token(1003, "world"),
            self.chat_event(180, stage="done", status="completed"),
        ]

    async def assert_hello_world_as_the_end_left_it(self, store: StateStore) -> None:
        """The text, its last id and the end's check as they were when the job ended."""
        assert await store.text("chat", "job-1") == JobText(
            b"Hello world", last_id=1003, last_seq=1003, attempt=0
        )
        view = await store.view("chat", "job-1")
        assert view.text_last_id == 1003
        assert view.state is not None
        assert view.state.startswith(
            b'{"event_id":1004,"prev_event_id":1003,' + text_check(b"Hello world", truncated=False)
        )

    async def test_a_token_after_the_jobs_end_is_stale_and_the_text_agrees_with_its_check(
        self,
    ) -> None:
        store = await self.make_store()
        ended = await self.apply_stamped(store, self.hello_world())

        applied = await self.apply_stamped(store, [self.token(1004, "!")])

        assert (applied.judgements, applied.stamps) == ([STALE_AFTER_END], [None])
        assert ended.stamps[-1] == b'"event_id":1004,"prev_event_id":1003,' + text_check(
            b"Hello world", truncated=False
        )
        await self.assert_hello_world_as_the_end_left_it(store)

    async def test_a_token_after_the_end_in_the_same_batch_is_stale_too(self) -> None:
        store = await self.make_store()

        applied = await self.apply_stamped(store, [*self.hello_world(), self.token(1004, "!")])

        assert applied.judgements == [NEW_APPLY] * 5 + [STALE_AFTER_END]
        assert applied.stamps[-1] is None
        await self.assert_hello_world_as_the_end_left_it(store)

    async def test_only_the_first_token_after_the_end_is_told_apart(self) -> None:
        store = await self.make_store()
        await self.apply(store, self.hello_world())

        first = await self.apply(store, [self.token(1004, "!"), self.token(1005, "?")])
        then = await self.apply(store, [self.token(1006, ".")])

        assert first + then == [STALE_AFTER_END, STALE, STALE]
        await self.assert_hello_world_as_the_end_left_it(store)

    async def test_a_token_written_again_after_the_end_is_still_a_duplicate(self) -> None:
        store = await self.make_store()
        await self.apply(store, self.hello_world())

        again = [self.token(1003, "world"), self.token(1002, " ", stream_id=entry_id(99))]

        assert await self.apply(store, again) == [DUPLICATE, DUPLICATE]
        # A duplicate is no late write: the first token written after the end is still told.
        assert await self.apply(store, [self.token(1004, "!")]) == [STALE_AFTER_END]
        await self.assert_hello_world_as_the_end_left_it(store)

    async def test_a_newer_attempts_token_after_the_end_restarts_nothing(self) -> None:
        store = await self.make_store()
        await self.apply(store, self.hello_world())

        applied = await self.apply_stamped(
            store, [self.token(1001, "again", attempt=1, stream_id=entry_id(11))]
        )

        assert (applied.judgements, applied.stamps) == ([STALE_AFTER_END], [None])
        await self.assert_hello_world_as_the_end_left_it(store)

    async def test_a_token_after_a_failure_is_stale(self) -> None:
        store = await self.make_store()
        failed = self.chat_event(162, stage="answer", status="failed")
        await self.apply(store, [self.token(1001, "Hel"), failed])

        assert await self.apply(store, [self.token(1002, "lo")]) == [STALE_AFTER_END]
        assert await store.text("chat", "job-1") == JobText(
            b"Hel", last_id=1001, last_seq=1001, attempt=0
        )

    async def test_a_token_after_the_end_of_a_job_without_text_leaves_it_without(
        self,
    ) -> None:
        store = await self.make_store()
        await self.apply(store, [self.chat_event(180, stage="done", status="completed")])

        assert await self.apply(store, [self.token(1001, "late")]) == [STALE_AFTER_END]
        # Nothing of the late token is kept: a token of an older attempt is not stale for it.
        assert await self.apply(store, [self.token(1002, "later", attempt=0)]) == [STALE]
        assert await store.text("chat", "job-1") is None
        view = await store.view("chat", "job-1")
        assert (view.text_last_id, view.text_written_ms) == (None, None)

    async def test_a_stage_event_after_the_end_that_does_not_end_the_job_reopens_its_text(
        self,
    ) -> None:
        # The end is the job's latest stage event, as the gateway sees it: a later stage
        # event that is no end (a worker that went on) takes the job out of its end.
        store = await self.make_store()
        await self.apply(store, self.hello_world())
        await self.apply(store, [self.token(1004, "!")])

        went_on = self.chat_event(190, stage="answer", status="started")
        applied = await self.apply(store, [went_on, self.token(1005, "!")])

        assert applied == [NEW_APPLY, NEW_APPLY]
        text = await store.text("chat", "job-1")
        assert text is not None
        assert text.text == b"Hello world!"
        # Ended again: the first late token is told apart again.
        await self.apply(store, [self.chat_event(191, stage="done", status="completed")])
        assert await self.apply(store, [self.token(1006, "?")]) == [STALE_AFTER_END]

    # stamps

    async def test_the_events_of_a_job_of_stage_events_only_keep_their_seqs_as_ids(
        self,
    ) -> None:
        store = await self.make_store()
        events = [self.encoded(seq=n, stream_id=entry_id(n)) for n in (1, 2, 5)]

        first = await self.apply_stamped(store, events[:2])
        then = await self.apply_stamped(
            store, [events[2], self.encoded(seq=4, stream_id=entry_id(4), stage="late")]
        )

        assert first.stamps + then.stamps == [
            b'"event_id":1,',
            b'"event_id":2,"prev_event_id":1,',
            b'"event_id":5,"prev_event_id":2,',
            None,
        ]
        assert (await store.view("scan", "job-1")).history == [
            stamped(events[0].payload, b'"event_id":1,'),
            stamped(events[1].payload, b'"event_id":2,"prev_event_id":1,'),
            stamped(events[2].payload, b'"event_id":5,"prev_event_id":2,'),
        ]

    async def test_a_jobs_stage_events_and_tokens_share_one_sequence_of_ids(self) -> None:
        store = await self.make_store()
        started, saved = self.chat_event(1, stage="started"), self.chat_event(2, stage="saved")
        done = self.chat_event(3, stage="done", status="done")

        first = await self.apply_stamped(
            store, [started, self.token(1001, "Hi"), self.token(1002, " ✓")]
        )
        then = await self.apply_stamped(store, [saved, done])

        assert first.stamps + then.stamps == [
            b'"event_id":1,',
            b'"event_id":1001,"prev_event_id":1,',
            b'"event_id":1002,"prev_event_id":1001,',
            b'"event_id":1003,"prev_event_id":1002,',
            b'"event_id":1004,"prev_event_id":1003,' + text_check("Hi ✓".encode(), truncated=False),
        ]
        view = await store.view("chat", "job-1")
        assert view.history == [
            stamped(started.payload, b'"event_id":1,'),
            stamped(saved.payload, b'"event_id":1003,"prev_event_id":1002,'),
            stamped(done.payload, then.stamps[1] or b""),
        ]

    async def test_an_event_published_again_gets_the_stamp_it_was_first_published_with(
        self,
    ) -> None:
        store = await self.make_store()
        done = self.chat_event(2, stage="done", status="done")
        first = await self.apply_stamped(store, [self.token(1001, "Hi"), done, done])
        await self.apply(store, [self.token(1002, " again")])

        again = await self.apply_stamped(store, [done])

        assert first.judgements[1:] == [NEW_APPLY, NEW_REPUBLISH]
        assert again.judgements == [NEW_REPUBLISH]
        assert first.stamps[2] == again.stamps[0] == first.stamps[1]
        assert first.stamps[1] == b'"event_id":1002,"prev_event_id":1001,' + text_check(
            b"Hi", truncated=False
        )

    # Lifecycle events (`cancel_requested`, `input_received`, `needs_input`) are judged by their
    # own marker: never stale after later stages, making no later stage stale, kept in the
    # history with the next event id, leaving the job's state as it was.
    def lifecycle(self, number: int, *, stage: str = "cancel_requested", **overrides: Any) -> Any:
        fields = {"stream_id": entry_id(500 + number), "stage": stage, "status": "requested"}
        return self.encoded(seq=number, **(fields | overrides))

    async def test_a_lifecycle_event_after_later_stages_is_new(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.encoded(seq=30, stream_id=entry_id(30))])

        assert await self.apply(store, [self.lifecycle(1)]) == [NEW_APPLY]

    async def test_a_lifecycle_event_makes_no_later_stage_stale(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.encoded(seq=10, stream_id=entry_id(10))])
        await self.apply(store, [self.lifecycle(190, stage="needs_input", status="waiting")])

        assert await self.apply(store, [self.encoded(seq=11, stream_id=entry_id(11))]) == [
            NEW_APPLY
        ]

    async def test_a_lifecycle_event_read_again_is_published_again_unapplied(self) -> None:
        store = await self.make_store()
        first = await self.apply_stamped(store, [self.lifecycle(1)])
        again = await self.apply_stamped(store, [self.lifecycle(1)])

        assert again.judgements == [NEW_REPUBLISH]
        assert again.stamps == first.stamps
        assert len((await store.view("scan", "job-1")).history) == 1

    async def test_another_entry_with_the_same_lifecycle_marker_is_a_duplicate(self) -> None:
        store = await self.make_store()
        entry = await self.append_and_read(self.scan_0, "me")
        await self.apply(store, [self.lifecycle(1, stream_id=entry)])

        assert await self.apply(store, [self.lifecycle(1)]) == [DUPLICATE]

    async def test_two_kinds_with_the_same_seq_are_two_events(self) -> None:
        store = await self.make_store()
        judgements = await self.apply(
            store,
            [
                self.lifecycle(1),
                self.lifecycle(1, stage="input_received", stream_id=entry_id(601)),
            ],
        )

        assert judgements == [NEW_APPLY, NEW_APPLY]

    async def test_a_lifecycle_event_takes_the_next_id_and_leaves_the_state(self) -> None:
        store = await self.make_store()
        await self.apply(store, [self.encoded(seq=10, stream_id=entry_id(10))])
        stamps = (await self.apply_stamped(store, [self.lifecycle(1)])).stamps
        after = (
            await self.apply_stamped(store, [self.encoded(seq=11, stream_id=entry_id(11))])
        ).stamps

        assert stamps == [b'"event_id":11,"prev_event_id":10,']
        assert after == [b'"event_id":12,"prev_event_id":11,']
        view = await store.view("scan", "job-1")
        assert view.state is not None
        assert view.state.startswith(b'{"event_id":12,')
        assert [p[:16] for p in view.history] == [
            b'{"event_id":10,"',
            b'{"event_id":11,"',
            b'{"event_id":12,"',
        ]

    async def test_a_first_lifecycle_event_takes_id_zero_and_sets_no_state(self) -> None:
        store = await self.make_store()
        stamps = (await self.apply_stamped(store, [self.lifecycle(1)])).stamps

        assert stamps == [b'"event_id":0,']
        view = await store.view("scan", "job-1")
        assert view.state is None
        assert len(view.history) == 1
