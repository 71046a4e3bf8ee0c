"""In-memory adapter of `StateStore`, judging with the domain rules directly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup, WrongType
from eco_router.application.errors import TransientError
from eco_router.application.messages import Applied, EncodedEvent, JobView, ReadStart
from eco_router.application.ports import Clock, StateStore
from eco_router.domain.event import JobEvent
from eco_router.domain.event_size import DEFAULT_HISTORY_MAX_BYTES
from eco_router.domain.verdict import JobRecord, Judgement, judge


@dataclass(slots=True)
class _Job:
    last_seq: int | None = None
    applied_by: dict[int, str] = field(default_factory=dict)
    state: bytes | None = None
    history: list[bytes] = field(default_factory=list)
    history_bytes: int = 0
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
    ) -> None:
        self.available = True
        self._streams = streams
        self._group = group
        self._leases = streams.lease_table(group)
        self._clock = clock
        self._state_ttl_ms = state_ttl_s * 1000
        self._markers_ttl_ms = markers_ttl_s * 1000
        self._history_size = history_size
        self._history_max_bytes = history_max_bytes
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
        for item in events:
            stream = item.event.stream
            if stream in fenced or stream in gaps or stream not in fence:
                judgements.append(None)
                continue
            job = self._job(item.event.domain, item.event.job_id)
            judgement = judge(item.event, self._record(job, item.event))
            if judgement.takes_over:
                job.applied_by[item.event.seq] = item.event.stream_id
            if judgement.apply:
                now = self._clock.now_ms()
                job.last_seq = item.event.seq
                job.applied_by[item.event.seq] = item.event.stream_id
                job.state = item.payload
                self._append(job, item.payload)
                job.state_expires_ms = now + self._state_ttl_ms
                job.markers_expire_ms = now + self._markers_ttl_ms
            judgements.append(judgement)
        return Applied(judgements, fenced | {e.event.stream for e in events} - set(fence), gaps)

    def _record(self, job: _Job, event: JobEvent) -> JobRecord:
        """The job's record, with the entry that applied `event`'s seq among the gone ones
        when it is another entry the stream never held (as the script checks it)."""
        by = job.applied_by.get(event.seq)
        if by is None or by == event.stream_id or not self._streams.never_held(event.stream, by):
            return JobRecord(job.last_seq, job.applied_by)
        return JobRecord(job.last_seq, job.applied_by, frozenset({by}))

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
        if not self.available:
            raise TransientError("in-memory state store marked unavailable")
        job = self._job(domain, job_id)
        return JobView(state=job.state, history=list(job.history))

    def _job(self, domain: str, job_id: str) -> _Job:
        key = (domain, job_id)
        job = self._jobs.setdefault(key, _Job())
        now = self._clock.now_ms()
        if job.state is not None and now >= job.state_expires_ms:
            job.state, job.history, job.history_bytes = None, [], 0
        if job.applied_by and now >= job.markers_expire_ms:
            job.applied_by, job.last_seq = {}, None
        return job
