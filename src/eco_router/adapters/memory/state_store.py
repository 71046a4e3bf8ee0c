"""In-memory adapter of `StateStore`: keeps each job's record, state and history, and applies
the writes `domain.settle` decides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup, WrongType
from eco_router.application.errors import TransientError
from eco_router.application.port_values import Applied, EncodedEvent, JobView, ReadStart
from eco_router.application.ports import Clock, StateStore
from eco_router.domain.event_size import DEFAULT_HISTORY_MAX_BYTES
from eco_router.domain.settle import (
    JobKey,
    JobWrite,
    Limits,
    StoredJob,
    gone_candidates,
    settle,
)
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES, JobText
from eco_router.domain.verdict import Judgement


@dataclass(slots=True)
class _Job:
    """A job's record and the payloads kept beside it, with when each part expires: the
    state, history and text with the state TTL, the markers with theirs."""

    record: StoredJob = field(default_factory=StoredJob)
    state: bytes | None = None
    history: list[bytes] = field(default_factory=list)
    state_expires_ms: int = 0
    markers_expire_ms: int = 0


class InMemoryStateStore(StateStore):
    """Records, snapshots and histories in dicts, with the same TTLs as the Redis store; the
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
        self._limits = Limits(history_size, history_max_bytes, text_max_bytes)
        self._jobs: dict[JobKey, _Job] = {}

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
        judged = [
            n
            for n, item in enumerate(events)
            if item.event.stream in fence
            and item.event.stream not in fenced
            and item.event.stream not in gaps
        ]
        settling = [events[n] for n in judged]
        records = {e.event.job_key: self._job(*e.event.job_key).record for e in settling}
        gone = frozenset(
            entry
            for stream, entry in gone_candidates(settling, records)
            if self._streams.never_held(stream, entry)
        )
        settled = settle(settling, records, self._limits, gone)
        for write in settled.writes:
            self._store(write)
        judgements: list[Judgement | None] = [None] * len(events)
        stamps: list[bytes | None] = [None] * len(events)
        for n, judgement, fields in zip(judged, settled.judgements, settled.stamps, strict=True):
            judgements[n] = judgement
            stamps[n] = fields
        unheld = {e.event.stream for e in events} - set(fence)
        return Applied(judgements, fenced | unheld, gaps, stamps)

    def _store(self, write: JobWrite) -> None:
        """Apply one job's write; every write renews the job's TTLs (as the Redis store's do,
        a text made full by a token that was not routed included)."""
        job = self._jobs[write.job]
        job.record = write.record
        if write.state is not None:
            job.state = write.state
        if write.appended:
            job.history.extend(write.appended)
            del job.history[: write.dropped]
        now = self._clock.now_ms()
        renewed = now + self._state_ttl_ms
        job.state_expires_ms = (
            renewed if write.stage_applied else max(job.state_expires_ms, renewed)
        )
        job.markers_expire_ms = now + self._markers_ttl_ms

    def _gap(self, stream: str, start: ReadStart) -> bool:
        """Whether the first entry pending after the read's start is not the read's first."""
        try:
            return self._streams.gap_before(
                stream, self._group, after=start.after, first=start.first, consumer=start.consumer
            )
        except (NoGroup, WrongType):
            return False

    async def view(self, domain: str, job_id: str) -> JobView:
        self.views += 1
        if not self.available:
            raise TransientError("in-memory state store marked unavailable")
        job = self._job(domain, job_id)
        text = job.record.text
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
        text = self._job(domain, job_id).record.text
        if text is None or text.last_id is None or text.last_seq is None:
            return None
        assert text.content is not None
        return JobText(
            text.content, text.last_id, text.last_seq, text.attempt, text.spans(), text.full
        )

    def _job(self, domain: str, job_id: str) -> _Job:
        """The job, with what expired gone."""
        job = self._jobs.setdefault((domain, job_id), _Job())
        now = self._clock.now_ms()
        record = job.record
        if (job.state is not None or record.text is not None or job.history) and (
            now >= job.state_expires_ms
        ):
            job.state, job.history = None, []
            record = record._replace(history_sizes=(), text=None)
        if record.last_id is not None and now >= job.markers_expire_ms:
            record = record._replace(
                last_seq=None,
                last_id=None,
                markers={},
                lifecycle={},
                ended=False,
                written_after_end=False,
            )
        job.record = record
        return job
