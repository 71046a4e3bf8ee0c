"""Server-Sent Events for one job: frames, event names, and what to replay on (re)connect."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from eco_router.domain.text import JobText, recovery_payload

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True, slots=True)
class GatewayEvent:
    """A routed event as the gateway forwards it: its id in the job's one sequence (the SSE
    id), its kind, its JSON as published, and the id of the job's event before it (None:
    unknown, or the first) with whether it restarts the job's text."""

    event_id: int
    stage: str | None
    status: str | None
    data: bytes
    written_ms: int | None = None
    domain: str | None = None
    prev_id: int | None = None
    restart: bool = False
    # Worked out once: one event fans out to every viewer of its job, each asking again.
    _name: str = field(init=False, repr=False, compare=False)
    _frame: Frame | None = field(default=None, init=False, repr=False, compare=False)
    # Nothing follows a done or a failed event: the stream ends after it. A field, not a
    # property: it is asked for each viewer of each live event.
    terminal: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = _event_name(self.stage, self.status)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "terminal", name == "done" or name == "error")

    def belongs_to(self, domain: str) -> bool:
        """Channels are per job id only: the payload's domain tells two domains' jobs apart."""
        return self.domain is None or self.domain == domain

    @property
    def name(self) -> str:
        """The SSE event name: `done` for the final event, `error` for a failure, else the stage."""
        return self._name


def _event_name(stage: str | None, status: str | None) -> str:
    if stage == "done" or status == "done":
        return "done"
    if status == "failed":
        return "error"
    # The name goes on an `event:` line: anything that could break the framing is not used.
    if stage and _SAFE_NAME.fullmatch(stage):
        return stage
    return "progress"


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a job's stream: its id (None for a snapshot or a notice), its event name,
    its one line of JSON data, and `encoded`, the bytes a connection sends for it. A job's
    own stream sends them as `domain.sse` writes them; a stream of many jobs or a UI message
    stream retells the same frame in its own terms, without reading bytes back."""

    event_id: int | None
    name: str
    data: bytes
    encoded: bytes


def live_frame(event: GatewayEvent) -> Frame:
    """The frame of one event: encoded once, the same for every viewer of the job."""
    frame = event._frame
    if frame is None:
        name = event._name
        encoded = b"id: %d\nevent: %s\ndata: %s\n\n" % (event.event_id, name.encode(), event.data)
        frame = Frame(event.event_id, name, event.data, encoded)
        object.__setattr__(event, "_frame", frame)
    return frame


def event_frame(event: GatewayEvent) -> bytes:
    """`id`, `event` and `data` lines of one event."""
    return live_frame(event).encoded


def snapshot(state: GatewayEvent | None, job_id: str) -> Frame:
    """The job's state, sent first when the client may have missed events (or the job is unknown).

    One shape: `{"job_id": ..., "state": <the latest event as published, or null>}`. It
    carries no id: the client's Last-Event-ID keeps naming the last event it really got.
    """
    # job_id is checked against a JSON-safe alphabet before any stream opens.
    body = b"null" if state is None else state.data
    data = b'{"job_id":"%s","state":%s}' % (job_id.encode(), body)
    return Frame(None, "snapshot", data, b"event: snapshot\ndata: %s\n\n" % data)


def snapshot_frame(state: GatewayEvent | None, job_id: str) -> bytes:
    return snapshot(state, job_id).encoded


def notice(reason: str) -> Frame:
    """`event: error` telling why the stream ends without the job's end (`timeout`, `idle`)."""
    data = b'{"error":"%s"}' % reason.encode()
    return Frame(None, "error", data, b"event: error\ndata: %s\n\n" % data)


def error_frame(reason: str) -> bytes:
    return notice(reason).encoded


KEEPALIVE_FRAME = b": keepalive\n\n"

# Why a stream ended at the job's side: its end (`done`, `failed`), or no end coming (`idle`).
IDLE = "idle"
IDLE_NOTICE = notice(IDLE)
IDLE_FRAME = IDLE_NOTICE.encoded


def end_reason(event: GatewayEvent) -> str:
    """Why a stream ends at this terminal event: `done`, or `failed` for a job that failed."""
    return "failed" if event.name == "error" else event.name


def idle_left_ms(*, last_heard_ms: int, now_ms: int, idle_after_ms: int) -> int:
    """How long until a job last heard of at `last_heard_ms` is idle (0 or less: it is)."""
    return last_heard_ms + idle_after_ms - now_ms


def job_end(
    state: GatewayEvent | None,
    last_sent: int | None,
    *,
    last_heard_ms: int | None,
    now_ms: int,
    idle_after_ms: int,
) -> str | None:
    """Why a client that got `last_sent` has nothing more coming from this job, else None.

    - `done` or `failed`: the job's terminal event is at or below `last_sent`.
    - `idle`: the client has the job's latest event, which is not terminal, and nothing was
      heard of the job for `idle_after_ms` (`last_heard_ms`: the latest event's write time,
      or a later live event's arrival). Its end may have been lost (a failover that lost
      the last writes), or it was abandoned; either way none is coming.
    - A job with no state (unknown, not started yet, or expired) or not heard of at a known
      time is neither: nothing says it will not go on.
    """
    if state is None or last_sent is None or state.event_id > last_sent:
        return None
    if state.terminal:
        return end_reason(state)
    if last_heard_ms is not None and (
        idle_left_ms(last_heard_ms=last_heard_ms, now_ms=now_ms, idle_after_ms=idle_after_ms) <= 0
    ):
        return IDLE
    return None


def missed_text(text_last_id: int | None, last_sent: int | None) -> bool:
    """Whether a client that got `last_sent` lacks tokens of the job's text (whose last token
    has id `text_last_id`): then it needs the text, read whole."""
    return text_last_id is not None and (last_sent is None or text_last_id > last_sent)


def missed_before(event: GatewayEvent, last_sent: int | None) -> bool:
    """Whether a live event tells that the client missed events before it: the job's event
    before it is past what the client got, or it restarts the text (a new attempt)."""
    if event.restart:
        return True
    return event.prev_id is not None and (last_sent is None or event.prev_id > last_sent)


RECOVERY_STAGE = "token_recovery"


def text_recovery(text: JobText, job_id: str, state: GatewayEvent | None) -> GatewayEvent:
    """The `token_recovery` event that stands for every token up to the text's last one.

    Its id is the last token's, so the client's Last-Event-ID goes on from there. It is
    `completed` only when the job's terminal event is behind it: nothing follows it then (a
    reference frontend closes its stream on it, and would otherwise miss `done`).
    """
    completed = state is not None and state.terminal and state.event_id < text.last_id
    return GatewayEvent(
        event_id=text.last_id,
        stage=RECOVERY_STAGE,
        status="snapshot",
        data=recovery_payload(text, job_id, completed=completed),
    )


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """What a (re)connecting client gets before live events."""

    snapshot: bool
    events: list[GatewayEvent]


def plan_replay(
    *,
    last_event_id: int | None,
    history: Sequence[GatewayEvent],
    state: GatewayEvent | None,
    history_size: int,
    history_bytes: int = 0,
    trimmed_above_bytes: int | None = None,
    recovery: GatewayEvent | None = None,
) -> ReplayPlan:
    """Replay every history event after `last_event_id`, in id order, with the text's
    `recovery` (if the client missed tokens) in its place among them: the stage events it
    needs, one frame for the text up to its last token, then what came after.

    A snapshot comes first when the job is unknown, or when the history may have lost its
    oldest events and no longer reaches back to the client's id (or to the start, for a new
    client): the client then knows it may have missed events instead of living with a silent
    gap. A history may have lost events when it is full (`history_size` events) or, under a
    byte cap, when its payloads (`history_bytes`) exceed `trimmed_above_bytes`: the cap less
    the largest event, what a history trimmed by bytes always keeps more than.
    """
    ordered = sorted(history, key=lambda e: e.event_id)
    after = -1 if last_event_id is None else last_event_id
    events = [e for e in ordered if e.event_id > after]
    if recovery is not None and recovery.event_id > after:
        events.append(recovery)
        events.sort(key=lambda e: e.event_id)
    unknown = state is None and not ordered and recovery is None
    reaches_back = last_event_id is not None and bool(ordered) and ordered[0].event_id <= after + 1
    trimmed_by_bytes = trimmed_above_bytes is not None and history_bytes > trimmed_above_bytes
    gap = (len(ordered) >= history_size or trimmed_by_bytes) and not reaches_back
    return ReplayPlan(snapshot=unknown or gap, events=events)
