"""Server-Sent Events for one job: frames, event names, and what to replay on (re)connect."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True, slots=True)
class GatewayEvent:
    """A routed event as the gateway forwards it: its seq, its kind and its JSON as published."""

    seq: int
    stage: str | None
    status: str | None
    data: bytes
    written_ms: int | None = None
    domain: str | None = None

    def belongs_to(self, domain: str) -> bool:
        """Channels are per job id only: the payload's domain tells two domains' jobs apart."""
        return self.domain is None or self.domain == domain

    @property
    def name(self) -> str:
        """The SSE event name: `done` for the final event, `error` for a failure, else the stage."""
        if self.stage == "done" or self.status == "done":
            return "done"
        if self.status == "failed":
            return "error"
        # The name goes on an `event:` line: anything that could break the framing is not used.
        if self.stage and _SAFE_NAME.fullmatch(self.stage):
            return self.stage
        return "progress"

    @property
    def terminal(self) -> bool:
        """Nothing follows a done or a failed event: the stream ends after it."""
        return self.name in {"done", "error"}


def event_frame(event: GatewayEvent) -> bytes:
    """`id`, `event` and `data` lines of one event."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.seq, event.name.encode(), event.data)


def snapshot_frame(state: GatewayEvent | None, job_id: str) -> bytes:
    """The job's state, sent first when the client may have missed events (or the job is unknown).

    One shape: `{"job_id": ..., "state": <the latest event as published, or null>}`. It
    carries no id: the client's Last-Event-ID keeps naming the last event it really got.
    """
    # job_id is checked against a JSON-safe alphabet before any stream opens.
    body = b"null" if state is None else state.data
    return b'event: snapshot\ndata: {"job_id":"%s","state":%s}\n\n' % (job_id.encode(), body)


def error_frame(reason: str) -> bytes:
    return b'event: error\ndata: {"error":"%s"}\n\n' % reason.encode()


KEEPALIVE_FRAME = b": keepalive\n\n"


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
) -> ReplayPlan:
    """Replay every history event after `last_event_id`, in seq order.

    A snapshot comes first when the job is unknown, or when the history is full and no longer
    reaches back to the client's id (or to the start, for a new client): the client then knows
    it may have missed events instead of living with a silent gap.
    """
    ordered = sorted(history, key=lambda e: e.seq)
    after = -1 if last_event_id is None else last_event_id
    events = [e for e in ordered if e.seq > after]
    unknown = state is None and not ordered
    # A full history may have lost its oldest events to trimming: unless it still reaches
    # back to the client's id, the client cannot be sure it has seen everything.
    reaches_back = last_event_id is not None and bool(ordered) and ordered[0].seq <= after + 1
    gap = len(ordered) >= history_size and not reaches_back
    return ReplayPlan(snapshot=unknown or gap, events=events)
