"""In-memory adapter of `StateStore`, judging with the domain rules directly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup, WrongType
from eco_router.application.errors import TransientError
from eco_router.application.port_values import Applied, EncodedEvent, JobView, ReadStart
from eco_router.application.ports import Clock, StateStore
from eco_router.domain.control import lifecycle_event_id
from eco_router.domain.event import JobEvent
from eco_router.domain.event_size import DEFAULT_HISTORY_MAX_BYTES
from eco_router.domain.text import (
    DEFAULT_TEXT_MAX_BYTES,
    JobText,
    TextCheck,
    TextRecord,
    TextRun,
    next_event_id,
    stamp,
    stamped,
)
from eco_router.domain.verdict import JobRecord, Judgement, Verdict, judge


@dataclass(slots=True)
class _Text:
    """A job's text and its last token, as the script keeps them."""

    attempt: int
    last_seq: int | None = None
    last_id: int | None = None
    last_entry: str | None = None
    text: bytearray = field(default_factory=bytearray)
    runs: list[TextRun] = field(default_factory=list)
    full: bool = False

    def record(self) -> TextRecord:
        return TextRecord(self.attempt, self.last_seq, len(self.text), self.full)

    def append(self, content: bytes, node: str | None) -> None:
        last = self.runs[-1] if self.runs else None
        if (
            node is not None
            and last is not None
            and last.node == node
            and last.end == len(self.text)
        ):
            self.runs[-1] = TextRun(node, last.start, len(self.text) + len(content))
        elif node is not None:
            self.runs.append(TextRun(node, len(self.text), len(self.text) + len(content)))
        self.text.extend(content)


@dataclass(slots=True)
class _Job:
    last_seq: int | None = None
    last_id: int | None = None
    applied_by: dict[int, str] = field(default_factory=dict)
    stamps: dict[int, bytes] = field(default_factory=dict)
    lifecycle_by: dict[str, str] = field(default_factory=dict)
    lifecycle_stamps: dict[str, bytes] = field(default_factory=dict)
    state: bytes | None = None
    history: list[bytes] = field(default_factory=list)
    history_bytes: int = 0
    text: _Text | None = None
    # The latest applied stage event ends the job; a token was judged after that end.
    ended: bool = False
    written_after_end: bool = False
    state_expires_ms: int = 0
    markers_expire_ms: int = 0


class InMemoryStateStore(StateStore):
    """Snapshots, histories and markers in dicts, with the same TTLs as the Redis store; the
    fencing epochs and pending entries it checks are those of `group` on `streams`."""

    def __init__(
        self,
        *,
        clock: Clock,
        streams: InMemoryStreams,
        group: str,
        state_ttl_s: int,
        markers_ttl_s: int,
        history_size: int,
        history_max_bytes: int = DEFAULT_HISTORY_MAX_BYTES,
        text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES,
    ) -> None:
        self.available = True
        # Reads of a job's view so far: each is a round trip to a real store.
        self.views = 0
        self._streams = streams
        self._group = group
        self._leases = streams.lease_table(group)
        self._clock = clock
        self._state_ttl_ms = state_ttl_s * 1000
        self._markers_ttl_ms = markers_ttl_s * 1000
        self._history_size = history_size
        self._history_max_bytes = history_max_bytes
        self._text_max_bytes = text_max_bytes
        self._jobs: dict[tuple[str, str], _Job] = {}

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        if not self.available:
            raise TransientError("in-memory state store marked unavailable")
        fenced = frozenset(s for s, token in fence.items() if not self._leases.holds(s, token))
        starts = in_order or {}
        gaps = frozenset(
            s for s in fence if s not in fenced and s in starts and self._gap(s, starts[s])
        )
        judgements: list[Judgement | None] = []
        stamps: list[bytes | None] = []
        for item in events:
            stream = item.event.stream
            if stream in fenced or stream in gaps or stream not in fence:
                judgements.append(None)
                stamps.append(None)
                continue
            job = self._job(item.event.domain, item.event.job_id)
            judgement = judge(
                item.event, self._record(job, item.event), text_max_bytes=self._text_max_bytes
            )
            judgements.append(judgement)
            stamps.append(self._settle(job, item, judgement))
        unheld = {e.event.stream for e in events} - set(fence)
        return Applied(judgements, fenced | unheld, gaps, stamps)

    def _settle(self, job: _Job, item: EncodedEvent, judgement: Judgement) -> bytes | None:
        """Apply what `judgement` says to `job`; the published event's stamp, if it is."""
        event = item.event
        now = self._clock.now_ms()
        if event.is_token:
            return self._settle_token(job, event, judgement, now)
        if event.is_lifecycle:
            return self._settle_lifecycle(job, item, judgement, now)
        if judgement.takes_over:
            job.applied_by[event.seq] = event.stream_id
        if not judgement.apply:
            if not judgement.publish:
                return None
            # A marker from before event ids: the event was published with its seq as id.
            return job.stamps.get(event.seq, b'"event_id":%d,' % event.seq)
        event_id = next_event_id(job.last_id, event.seq)
        check = None
        if event.is_terminal and job.text is not None:
            check = TextCheck.of(bytes(job.text.text), truncated=job.text.full)
        fields = stamp(event_id, job.last_id, text_check=check)
        job.last_id = event_id
        job.last_seq = event.seq
        job.ended, job.written_after_end = event.is_terminal, False
        job.applied_by[event.seq] = event.stream_id
        job.stamps[event.seq] = fields
        job.state = stamped(item.payload, fields)
        self._append(job, job.state)
        job.state_expires_ms = now + self._state_ttl_ms
        job.markers_expire_ms = now + self._markers_ttl_ms
        return fields

    def _settle_lifecycle(
        self, job: _Job, item: EncodedEvent, judgement: Judgement, now: int
    ) -> bytes | None:
        """A lifecycle event goes to the history with its own marker; the job's state (its
        latest stage event) and stage seqs stay as they were."""
        marker = item.event.lifecycle_marker
        if judgement.takes_over:
            job.lifecycle_by[marker] = item.event.stream_id
        if not judgement.apply:
            return job.lifecycle_stamps.get(marker) if judgement.publish else None
        event_id = lifecycle_event_id(job.last_id)
        fields = stamp(event_id, job.last_id)
        job.last_id = event_id
        job.lifecycle_by[marker] = item.event.stream_id
        job.lifecycle_stamps[marker] = fields
        self._append(job, stamped(item.payload, fields))
        job.state_expires_ms = max(job.state_expires_ms, now + self._state_ttl_ms)
        job.markers_expire_ms = now + self._markers_ttl_ms
        return fields

    def _settle_token(
        self, job: _Job, event: JobEvent, judgement: Judgement, now: int
    ) -> bytes | None:
        if judgement.first_after_end:
            job.written_after_end = True
        if judgement.verdict is Verdict.STALE:
            return None
        if judgement.restarts or job.text is None:
            job.text = _Text(event.attempt)
        text = job.text
        if judgement.fills:
            text.full = True
        if not judgement.apply:
            return None
        event_id = next_event_id(job.last_id, event.seq)
        fields = stamp(event_id, job.last_id, restart=judgement.restarts)
        job.last_id = event_id
        text.append(event.content.encode(), event.node)
        text.last_seq, text.last_id, text.last_entry = event.seq, event_id, event.stream_id
        job.state_expires_ms = max(job.state_expires_ms, now + self._state_ttl_ms)
        job.markers_expire_ms = now + self._markers_ttl_ms
        return fields

    def _record(self, job: _Job, event: JobEvent) -> JobRecord:
        """The job's record, with the entry that applied `event`'s seq among the gone ones
        when it is another entry the stream never held (as the script checks it)."""
        text = job.text.record() if job.text is not None else TextRecord()
        if event.is_token:
            return JobRecord(
                job.last_seq,
                None,
                text=text,
                ended=job.ended,
                written_after_end=job.written_after_end,
            )
        if event.is_lifecycle:
            by = job.lifecycle_by.get(event.lifecycle_marker)
        else:
            by = job.applied_by.get(event.seq)
        gone: frozenset[str] = frozenset()
        if by is not None and by != event.stream_id and self._streams.never_held(event.stream, by):
            gone = frozenset({by})
        return JobRecord(job.last_seq, job.applied_by, gone, text, job.lifecycle_by)

    def _gap(self, stream: str, start: ReadStart) -> bool:
        """Whether the first entry pending after the read's start is not the read's first."""
        try:
            return self._streams.gap_before(
                stream, self._group, after=start.after, first=start.first, consumer=start.consumer
            )
        except (NoGroup, WrongType):
            return False

    def _append(self, job: _Job, payload: bytes) -> None:
        """Append, then drop the oldest beyond the count or the bytes; the newest stays."""
        job.history.append(payload)
        job.history_bytes += len(payload)
        while len(job.history) > 1 and (
            len(job.history) > self._history_size or job.history_bytes > self._history_max_bytes
        ):
            job.history_bytes -= len(job.history.pop(0))

    async def view(self, domain: str, job_id: str) -> JobView:
        self.views += 1
        if not self.available:
            raise TransientError("in-memory state store marked unavailable")
        job = self._job(domain, job_id)
        text = job.text
        if text is None or text.last_id is None:
            return JobView(state=job.state, history=list(job.history))
        assert text.last_entry is not None
        return JobView(
            state=job.state,
            history=list(job.history),
            text_last_id=text.last_id,
            text_written_ms=int(text.last_entry.partition("-")[0]),
        )

    async def text(self, domain: str, job_id: str) -> JobText | None:
        if not self.available:
            raise TransientError("in-memory state store marked unavailable")
        text = self._job(domain, job_id).text
        if text is None or text.last_id is None or text.last_seq is None:
            return None
        return JobText(
            bytes(text.text), text.last_id, text.last_seq, text.attempt, tuple(text.runs), text.full
        )

    def _job(self, domain: str, job_id: str) -> _Job:
        key = (domain, job_id)
        job = self._jobs.setdefault(key, _Job())
        now = self._clock.now_ms()
        if (job.state is not None or job.text is not None or job.history) and (
            now >= job.state_expires_ms
        ):
            job.state, job.history, job.history_bytes, job.text = None, [], 0, None
        if job.last_id is not None and now >= job.markers_expire_ms:
            job.applied_by, job.stamps, job.last_seq, job.last_id = {}, {}, None, None
            job.lifecycle_by, job.lifecycle_stamps = {}, {}
            job.ended, job.written_after_end = False, False
        return job
