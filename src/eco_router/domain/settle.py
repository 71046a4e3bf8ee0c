"""A batch settled against its jobs' records: every verdict, event id, stamp, text and history
change, and the writes that persist them. The one home of the job rules; a store only keeps
records and applies writes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from eco_router.domain.control import lifecycle_event_id
from eco_router.domain.event import JobEvent
from eco_router.domain.text import (
    TextCheck,
    TextRecord,
    TextRun,
    next_event_id,
    stamp,
    stamped,
)
from eco_router.domain.verdict import (
    NEW_APPLY,
    Judgement,
    TextFacts,
    Verdict,
    judge_lifecycle,
    judge_stage,
    judge_token,
)

JobKey = tuple[str, str]
# No markers: shared, and read only.
_NONE: Mapping[Any, Any] = MappingProxyType({})


class Encoded(Protocol):
    """An event with its wire payload (the JSON object routed)."""

    @property
    def event(self) -> JobEvent: ...

    @property
    def payload(self) -> bytes: ...


# Marker, StoredJob and JobWrite are built per job and batch on the router's hot path: as
# named tuples they are as immutable as frozen dataclasses, at a fifth of the cost to build.


class Marker(NamedTuple):
    """Which entry applied a seq (or a lifecycle marker), and the fields it was stamped with:
    an entry read again publishes with the same stamp."""

    entry: str
    stamp: bytes


@dataclass(frozen=True, slots=True)
class StoredText:
    """A job's text as kept: the attempt it belongs to, its last token (seq, id, entry), its
    bytes (`content`: None when the store did not load them, as it needs them only for a
    terminal event's check) and their count, which node wrote which stretch (the runs
    closed, and the node writing now, "" for none, from `run_at` on), and whether it is
    full."""

    attempt: int
    last_seq: int | None = None
    last_id: int | None = None
    last_entry: str | None = None
    content: bytes | None = b""
    size: int = 0
    runs: tuple[TextRun, ...] = ()
    node: str = ""
    run_at: int = 0
    full: bool = False

    def spans(self) -> tuple[TextRun, ...]:
        """Every run, the one being written included."""
        if not self.node:
            return self.runs
        return (*self.runs, TextRun(self.node, self.run_at, self.size))


class StoredJob(NamedTuple):
    """What the rules need of one job, as a store keeps it: the newest applied stage seq and
    event id, the markers of applied seqs and lifecycle events, whether it has ended (and a
    token was judged after the end), the size of each payload its history holds, oldest
    first, and its text. The state and the history's payloads are kept beside it."""

    last_seq: int | None = None
    last_id: int | None = None
    markers: Mapping[int, Marker] = _NONE
    lifecycle: Mapping[str, Marker] = _NONE
    ended: bool = False
    written_after_end: bool = False
    history_sizes: tuple[int, ...] = ()
    text: StoredText | None = None


class JobWrite(NamedTuple):
    """What persists one job's settled events: its record after them, the markers set, the
    state replaced (None: kept), the payloads appended to its history and how many of the
    oldest are dropped after, and its text restarted and/or appended to."""

    job: JobKey
    stream: str
    record: StoredJob
    markers: Mapping[int, Marker]
    lifecycle: Mapping[str, Marker]
    state: bytes | None
    appended: tuple[bytes, ...]
    dropped: int
    text_restarted: bool
    text_appended: bytes
    # An event was applied (the job's keys live on), and a stage event among them (the
    # state lives its whole TTL from now).
    applied: bool
    stage_applied: bool


@dataclass(frozen=True, slots=True)
class Settlement:
    """Per event, in the batch's order, its judgement and the fields put first in its JSON
    when it is published (None when it is not); per job changed, in first-seen order, its
    write."""

    judgements: list[Judgement]
    stamps: list[bytes | None]
    writes: list[JobWrite]


@dataclass(frozen=True, slots=True)
class Limits:
    """A job's bounds: payloads and bytes its history keeps, bytes its text may hold."""

    history_size: int
    history_max_bytes: int
    text_max_bytes: int


def gone_candidates(
    events: Iterable[Encoded], records: Mapping[JobKey, StoredJob]
) -> set[tuple[str, str]]:
    """The (stream, entry) pairs a store must look up before settling: entries that may have
    marked an event's seq or lifecycle marker before it, other than the event's own (those
    the records name, and the batch's own when two of its entries share a seq). Those the
    stream never held go to `settle` as `gone`."""
    asked: set[tuple[str, str]] = set()
    # Per job and seq (or lifecycle marker), the first of the batch's entries that names it.
    first: dict[tuple[JobKey, int | str], str] = {}
    for item in events:
        event = item.event
        if event.is_token:
            continue
        job = event.job_key
        entry = event.stream_id
        record = records.get(job)
        name: int | str
        if event.is_lifecycle:
            name = event.lifecycle_marker
            marker = record.lifecycle.get(name) if record is not None else None
        else:
            name = event.seq
            marker = record.markers.get(name) if record is not None else None
        if marker is not None and marker.entry != entry:
            asked.add((event.stream, marker.entry))
        before = first.setdefault((job, name), entry)
        if before != entry:
            asked.add((event.stream, before))
            asked.add((event.stream, entry))
    return asked


def settle(
    events: Sequence[Encoded],
    records: Mapping[JobKey, StoredJob],
    limits: Limits,
    gone: frozenset[str] = frozenset(),
) -> Settlement:
    """Judge the events in the order given (`in_judging_order`) against their jobs' records
    (a job absent from `records` has none) and settle each one's effects.

    - The verdicts are `judge`'s; `gone` holds the entries of the records' markers that
      their stream never held, and of the batch's (`gone_candidates`).
    - A stage event applied: the next event id (`next_event_id`), stamped with the id
      before it and, when it ends a job with a text, the text's check; it becomes the state,
      joins the history and marks its seq; the job has ended when it ends the job.
    - A lifecycle event applied: the id after the job's last; it joins the history and marks
      its marker; the state and the stage seqs stay.
    - A token applied: the next event id, a restart flag on a newer attempt's first; its
      content joins the text (the node's run grows or a new one begins).
    - An entry in place of a gone one takes over the marker and publishes with its stamp;
      an entry read again publishes with the stamp it was given.
    - The history keeps at most `history_size` payloads and `history_max_bytes` bytes,
      dropping the oldest; the newest always stays.
    """
    by_job: dict[JobKey, _Settling] = {}
    judgements: list[Judgement] = []
    stamps: list[bytes | None] = []
    text_max_bytes = limits.text_max_bytes
    for item in events:
        event = item.event
        key = event.job_key
        job = by_job.get(key)
        if job is None:
            job = by_job[key] = _Settling(event.stream, records.get(key) or StoredJob(), gone)
        if event.is_token:
            judgement = judge_token(event, job, text_max_bytes=text_max_bytes)
            fields = job.token(event, judgement)
        elif event.is_lifecycle:
            judgement = judge_lifecycle(event, job)
            fields = job.lifecycle_event(item, judgement)
        else:
            judgement = judge_stage(event, job)
            fields = job.stage_event(item, judgement)
        judgements.append(judgement)
        stamps.append(fields)
    writes = [job.write(key, limits) for key, job in by_job.items() if job.changed()]
    return Settlement(judgements, stamps, writes)


# What `judge_token` sees of a job with no text yet.
_NO_TEXT = TextRecord()


class _Text:
    """A job's text as its tokens settle: `StoredText`'s fields, mutable, with the bytes of
    this batch's tokens kept apart from those stored."""

    __slots__ = (
        "appended",
        "attempt",
        "content",
        "full",
        "last_entry",
        "last_id",
        "last_seq",
        "node",
        "run_at",
        "runs",
        "stored_size",
    )

    def __init__(self, text: StoredText) -> None:
        self.attempt: int = text.attempt
        self.last_seq = text.last_seq
        self.last_id = text.last_id
        self.last_entry = text.last_entry
        self.content = text.content
        self.stored_size = text.size
        self.appended = bytearray()
        self.runs = text.runs
        self.node = text.node
        self.run_at = text.run_at
        self.full = text.full

    @property
    def size(self) -> int:
        return self.stored_size + len(self.appended)

    def append(self, event: JobEvent, event_id: int) -> None:
        """Add a token applied with `event_id`: the node's run grows or a new one begins."""
        # A node's run closes when another node (or none) writes; an empty one leaves none.
        node = event.node or ""
        if node != self.node:
            size = self.size
            if self.node and size > self.run_at:
                self.runs = (*self.runs, TextRun(self.node, self.run_at, size))
            self.run_at = size
            self.node = node
        self.appended += event.content.encode()
        self.last_seq = event.seq
        self.last_id = event_id
        self.last_entry = event.stream_id

    def text_bytes(self) -> bytes:
        content = self.content
        assert content is not None, "a terminal event's check needs the text's bytes loaded"
        return content + self.appended

    def stored(self) -> StoredText:
        return StoredText(
            attempt=self.attempt,
            last_seq=self.last_seq,
            last_id=self.last_id,
            last_entry=self.last_entry,
            content=None if self.content is None else self.content + self.appended,
            size=self.size,
            runs=self.runs,
            node=self.node,
            run_at=self.run_at,
            full=self.full,
        )


class _Settling:
    """One job's record as its events settle, and what changed; what the rules judge its
    next event against (`JobFacts`)."""

    __slots__ = (
        "appended",
        "applied",
        "before",
        "ended",
        "gone",
        "last_id",
        "last_seq",
        "lifecycle",
        "markers",
        "new_lifecycle",
        "new_markers",
        "stage_applied",
        "state",
        "stream",
        "text_changed",
        "text_restarted",
        "text_state",
        "written_after_end",
    )

    def __init__(self, stream: str, record: StoredJob, gone: frozenset[str]) -> None:
        self.stream = stream
        self.before = record
        # The entries the stream never held: those of the records' markers and the batch's.
        self.gone = gone
        self.last_seq = record.last_seq
        self.last_id = record.last_id
        self.markers = record.markers
        self.lifecycle = record.lifecycle
        self.new_markers: dict[int, Marker] = {}
        self.new_lifecycle: dict[str, Marker] = {}
        self.ended = record.ended
        self.written_after_end = record.written_after_end
        self.text_state = None if record.text is None else _Text(record.text)
        self.text_changed = False
        self.text_restarted = False
        self.state: bytes | None = None
        self.appended: list[bytes] = []
        self.applied = False
        self.stage_applied = False

    @property
    def text(self) -> TextFacts:
        return _NO_TEXT if self.text_state is None else self.text_state

    def entry_that_applied(self, seq: int) -> str | None:
        marker = self.marker(seq)
        return None if marker is None else marker.entry

    def entry_that_marked(self, marker: str) -> str | None:
        found = self.lifecycle_marker(marker)
        return None if found is None else found.entry

    def marker(self, seq: int) -> Marker | None:
        return self.new_markers.get(seq) or self.markers.get(seq)

    def lifecycle_marker(self, name: str) -> Marker | None:
        return self.new_lifecycle.get(name) or self.lifecycle.get(name)

    def stage_event(self, item: Encoded, judgement: Judgement) -> bytes | None:
        """Apply what `judgement` says of a stage event; the published event's stamp, if it is."""
        if judgement is NEW_APPLY:
            return self._apply_stage(item)
        event = item.event
        if judgement.takes_over:
            marker = self.marker(event.seq)
            assert marker is not None
            self.new_markers[event.seq] = Marker(event.stream_id, marker.stamp)
        if not judgement.apply:
            if not judgement.publish:
                return None
            marker = self.marker(event.seq)
            assert marker is not None
            return marker.stamp
        return self._apply_stage(item)

    def _apply_stage(self, item: Encoded) -> bytes:
        event = item.event
        event_id = next_event_id(self.last_id, event.seq)
        ends = event.is_terminal
        text = self.text_state
        check = None
        if ends and text is not None:
            check = TextCheck.of(text.text_bytes(), truncated=text.full)
        fields = stamp(event_id, self.last_id, text_check=check)
        self.last_id = event_id
        self.last_seq = event.seq
        self.ended, self.written_after_end = ends, False
        self.new_markers[event.seq] = Marker(event.stream_id, fields)
        self.state = stamped(item.payload, fields)
        self.appended.append(self.state)
        self.applied = self.stage_applied = True
        return fields

    def lifecycle_event(self, item: Encoded, judgement: Judgement) -> bytes | None:
        """Apply what `judgement` says of a lifecycle event; its stamp, if it is published."""
        name = item.event.lifecycle_marker
        if judgement.takes_over:
            marker = self.lifecycle_marker(name)
            assert marker is not None
            self.new_lifecycle[name] = Marker(item.event.stream_id, marker.stamp)
        if not judgement.apply:
            if not judgement.publish:
                return None
            marker = self.lifecycle_marker(name)
            assert marker is not None
            return marker.stamp
        event_id = lifecycle_event_id(self.last_id)
        fields = stamp(event_id, self.last_id)
        self.last_id = event_id
        self.new_lifecycle[name] = Marker(item.event.stream_id, fields)
        self.appended.append(stamped(item.payload, fields))
        self.applied = True
        return fields

    def token(self, event: JobEvent, judgement: Judgement) -> bytes | None:
        """Apply what `judgement` says of a token; its stamp, if it is published."""
        text = self.text_state
        if judgement is NEW_APPLY and text is not None:
            return self._append(text, event, restart=False)
        if judgement.first_after_end:
            self.written_after_end = True
        if judgement.verdict is Verdict.STALE:
            return None
        if judgement.restarts or text is None:
            text = self.text_state = _Text(StoredText(event.attempt))
            self.text_restarted = self.text_changed = True
        if judgement.fills:
            text.full = True
            self.text_changed = True
        if not judgement.apply:
            return None
        return self._append(text, event, restart=judgement.restarts)

    def _append(self, text: _Text, event: JobEvent, *, restart: bool) -> bytes:
        event_id = next_event_id(self.last_id, event.seq)
        fields = stamp(event_id, self.last_id, restart=restart)
        self.last_id = event_id
        text.append(event, event_id)
        self.text_changed = self.applied = True
        return fields

    def changed(self) -> bool:
        return (
            self.applied
            or bool(self.new_markers)
            or bool(self.new_lifecycle)
            or self.text_changed
            or self.written_after_end != self.before.written_after_end
        )

    def write(self, job: JobKey, limits: Limits) -> JobWrite:
        before = self.before
        sizes = before.history_sizes
        if self.appended:
            sizes = (*sizes, *map(len, self.appended))
        history_sizes, dropped = _kept(sizes, limits)
        text = self.text_state
        markers = {**self.markers, **self.new_markers} if self.new_markers else self.markers
        lifecycle = (
            {**self.lifecycle, **self.new_lifecycle} if self.new_lifecycle else self.lifecycle
        )
        record = StoredJob(
            last_seq=self.last_seq,
            last_id=self.last_id,
            markers=markers,
            lifecycle=lifecycle,
            ended=self.ended,
            written_after_end=self.written_after_end,
            history_sizes=history_sizes,
            text=text.stored() if self.text_changed and text is not None else before.text,
        )
        return JobWrite(
            job=job,
            stream=self.stream,
            record=record,
            markers=self.new_markers,
            lifecycle=self.new_lifecycle,
            state=self.state,
            appended=tuple(self.appended),
            dropped=dropped,
            text_restarted=self.text_restarted,
            text_appended=b"" if text is None else bytes(text.appended),
            applied=self.applied,
            stage_applied=self.stage_applied,
        )


def _kept(sizes: tuple[int, ...], limits: Limits) -> tuple[tuple[int, ...], int]:
    """The sizes a history keeps of `sizes` (oldest first), and how many of the oldest it
    drops: at most `history_size` payloads and `history_max_bytes` bytes, never the newest."""
    dropped = max(0, min(len(sizes) - 1, len(sizes) - limits.history_size))
    kept = sizes[dropped:] if dropped else sizes
    total = sum(kept)
    if total <= limits.history_max_bytes:
        return kept, dropped
    for size in sizes[dropped:-1]:
        total -= size
        dropped += 1
        if total <= limits.history_max_bytes:
            break
    return sizes[dropped:], dropped
