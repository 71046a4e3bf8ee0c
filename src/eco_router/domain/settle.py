"""A batch settled against its jobs' records: every verdict, event id, stamp, text and history
change, and the writes that persist them. The one home of the job rules; a store only keeps
records and applies writes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

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
from eco_router.domain.verdict import JobRecord, Judgement, Verdict, judge

JobKey = tuple[str, str]


class Encoded(Protocol):
    """An event with its wire payload (the JSON object routed)."""

    @property
    def event(self) -> JobEvent: ...

    @property
    def payload(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Marker:
    """Which entry applied a seq (or a lifecycle marker), and the fields it was stamped with:
    an entry read again publishes with the same stamp."""

    entry: str
    stamp: bytes


@dataclass(frozen=True, slots=True)
class StoredText:
    """A job's text as kept: the attempt it belongs to, its last token (seq, id, entry), its
    bytes, which node wrote which stretch (the runs closed, and the node writing now, "" for
    none, from `run_at` on), and whether it is full."""

    attempt: int
    last_seq: int | None = None
    last_id: int | None = None
    last_entry: str | None = None
    content: bytes = b""
    runs: tuple[TextRun, ...] = ()
    node: str = ""
    run_at: int = 0
    full: bool = False

    def spans(self) -> tuple[TextRun, ...]:
        """Every run, the one being written included."""
        if not self.node:
            return self.runs
        return (*self.runs, TextRun(self.node, self.run_at, len(self.content)))


@dataclass(frozen=True, slots=True)
class StoredJob:
    """What the rules need of one job, as a store keeps it: the newest applied stage seq and
    event id, the markers of applied seqs and lifecycle events, whether it has ended (and a
    token was judged after the end), the size of each payload its history holds, oldest
    first, and its text. The state and the history's payloads are kept beside it."""

    last_seq: int | None = None
    last_id: int | None = None
    markers: Mapping[int, Marker] = field(default_factory=dict)
    lifecycle: Mapping[str, Marker] = field(default_factory=dict)
    ended: bool = False
    written_after_end: bool = False
    history_sizes: tuple[int, ...] = ()
    text: StoredText | None = None


@dataclass(frozen=True, slots=True)
class JobWrite:
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
    seen: dict[tuple[JobKey, int | str], set[str]] = {}
    for item in events:
        event = item.event
        if event.is_token:
            continue
        name: int | str = event.lifecycle_marker if event.is_lifecycle else event.seq
        record = records.get(event.job_key)
        if record is not None:
            marker = (
                record.lifecycle.get(event.lifecycle_marker)
                if event.is_lifecycle
                else record.markers.get(event.seq)
            )
            if marker is not None and marker.entry != event.stream_id:
                asked.add((event.stream, marker.entry))
        entries = seen.setdefault((event.job_key, name), set())
        entries.add(event.stream_id)
        if len(entries) > 1:
            asked.update((event.stream, entry) for entry in entries)
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
    for item in events:
        event = item.event
        job = by_job.get(event.job_key)
        if job is None:
            job = by_job[event.job_key] = _Settling(
                event.stream, records.get(event.job_key) or StoredJob()
            )
        judgement = judge(event, job.judged(event, gone), text_max_bytes=limits.text_max_bytes)
        judgements.append(judgement)
        stamps.append(job.settle(item, judgement))
    writes = [job.write(key, limits) for key, job in by_job.items() if job.changed()]
    return Settlement(judgements, stamps, writes)


class _Settling:
    """One job's record as its events settle, and what changed."""

    __slots__ = (
        "appended",
        "applied",
        "before",
        "ended",
        "last_id",
        "last_seq",
        "lifecycle",
        "markers",
        "new_lifecycle",
        "new_markers",
        "stage_applied",
        "state",
        "stream",
        "text",
        "text_appended",
        "text_restarted",
        "written_after_end",
    )

    def __init__(self, stream: str, record: StoredJob) -> None:
        self.stream = stream
        self.before = record
        self.last_seq = record.last_seq
        self.last_id = record.last_id
        self.markers = record.markers
        self.lifecycle = record.lifecycle
        self.new_markers: dict[int, Marker] = {}
        self.new_lifecycle: dict[str, Marker] = {}
        self.ended = record.ended
        self.written_after_end = record.written_after_end
        self.text = record.text
        self.text_restarted = False
        self.text_appended = bytearray()
        self.state: bytes | None = None
        self.appended: list[bytes] = []
        self.applied = False
        self.stage_applied = False

    def marker(self, seq: int) -> Marker | None:
        return self.new_markers.get(seq) or self.markers.get(seq)

    def lifecycle_marker(self, name: str) -> Marker | None:
        return self.new_lifecycle.get(name) or self.lifecycle.get(name)

    def judged(self, event: JobEvent, gone: frozenset[str]) -> JobRecord:
        """What `judge` looks at for `event`."""
        text = (
            TextRecord(
                self.text.attempt,
                self.text.last_seq,
                len(self.text.content) + len(self.text_appended),
                self.text.full,
            )
            if self.text is not None
            else TextRecord()
        )
        if event.is_token:
            return JobRecord(
                self.last_seq,
                None,
                text=text,
                ended=self.ended,
                written_after_end=self.written_after_end,
            )
        if event.is_lifecycle:
            marker = self.lifecycle_marker(event.lifecycle_marker)
            lifecycle_by = None if marker is None else {event.lifecycle_marker: marker.entry}
            by = None if marker is None else marker.entry
            applied_by = None
        else:
            marker = self.marker(event.seq)
            applied_by = None if marker is None else {event.seq: marker.entry}
            by = None if marker is None else marker.entry
            lifecycle_by = None
        lost = (
            frozenset({by})
            if by is not None and by != event.stream_id and by in gone
            else frozenset()
        )
        return JobRecord(self.last_seq, applied_by, lost, text, lifecycle_by)

    def settle(self, item: Encoded, judgement: Judgement) -> bytes | None:
        """Apply what `judgement` says; the published event's stamp, if it is."""
        event = item.event
        if event.is_token:
            return self._token(event, judgement)
        if event.is_lifecycle:
            return self._lifecycle(item, judgement)
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
        event_id = next_event_id(self.last_id, event.seq)
        check = None
        if event.is_terminal and self.text is not None:
            check = TextCheck.of(self._text_bytes(), truncated=self.text.full)
        fields = stamp(event_id, self.last_id, text_check=check)
        self.last_id = event_id
        self.last_seq = event.seq
        self.ended, self.written_after_end = event.is_terminal, False
        self.new_markers[event.seq] = Marker(event.stream_id, fields)
        self.state = stamped(item.payload, fields)
        self.appended.append(self.state)
        self.applied = self.stage_applied = True
        return fields

    def _lifecycle(self, item: Encoded, judgement: Judgement) -> bytes | None:
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

    def _token(self, event: JobEvent, judgement: Judgement) -> bytes | None:
        if judgement.first_after_end:
            self.written_after_end = True
        if judgement.verdict is Verdict.STALE:
            return None
        if judgement.restarts or self.text is None:
            self.text = StoredText(event.attempt)
            self.text_restarted = True
            self.text_appended = bytearray()
        if judgement.fills:
            self.text = replace(self.text, full=True)
        if not judgement.apply:
            return None
        event_id = next_event_id(self.last_id, event.seq)
        fields = stamp(event_id, self.last_id, restart=judgement.restarts)
        self.last_id = event_id
        content = event.content.encode()
        text = self.text
        size = len(text.content) + len(self.text_appended)
        # A node's run closes when another node (or none) writes; an empty one leaves none.
        node = event.node or ""
        runs, run_at = text.runs, text.run_at
        if node != text.node:
            if text.node and size > run_at:
                runs = (*runs, TextRun(text.node, run_at, size))
            run_at = size
        self.text_appended.extend(content)
        self.text = replace(
            text,
            last_seq=event.seq,
            last_id=event_id,
            last_entry=event.stream_id,
            runs=runs,
            node=node,
            run_at=run_at,
        )
        self.applied = True
        return fields

    def _text_bytes(self) -> bytes:
        assert self.text is not None
        return self.text.content + bytes(self.text_appended)

    def changed(self) -> bool:
        before = self.before
        return (
            self.applied
            or bool(self.new_markers)
            or bool(self.new_lifecycle)
            or self.text_restarted
            or self.text is not before.text
            or self.written_after_end != before.written_after_end
        )

    def write(self, job: JobKey, limits: Limits) -> JobWrite:
        sizes = [*self.before.history_sizes, *(len(p) for p in self.appended)]
        total = sum(sizes)
        dropped = 0
        while len(sizes) - dropped > 1 and (
            len(sizes) - dropped > limits.history_size or total > limits.history_max_bytes
        ):
            total -= sizes[dropped]
            dropped += 1
        text = self.text
        if text is not None and self.text_appended:
            text = replace(text, content=text.content + bytes(self.text_appended))
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
            history_sizes=tuple(sizes[dropped:]),
            text=text,
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
            text_appended=bytes(self.text_appended),
            applied=self.applied,
            stage_applied=self.stage_applied,
        )
