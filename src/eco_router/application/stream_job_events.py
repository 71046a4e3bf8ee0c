"""Use case: stream one job's events to one client as Server-Sent Events."""

from __future__ import annotations

import logging
from array import array
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from eco_router.application.errors import TransientError
from eco_router.application.frame_buffer import FrameBuffer
from eco_router.application.port_values import FeedClosed, FeedGap, JobView, LiveEvent
from eco_router.application.ports import (
    Clock,
    EventDecoder,
    EventFeed,
    FeedSubscription,
    FrameWriter,
    GatewayMetrics,
    StateStore,
)
from eco_router.application.presence import ViewerTally
from eco_router.domain.sse import (
    IDLE,
    IDLE_NOTICE,
    Frame,
    GatewayEvent,
    end_reason,
    idle_left_ms,
    job_end,
    live_frame,
    missed_before,
    missed_text,
    notice,
    plan_replay,
    snapshot,
    text_recovery,
)

log = logging.getLogger(__name__)


class StreamUnavailable(TransientError):
    """A stream cannot be opened because one of its dependencies is unreachable.

    `service` names it (`pubsub`, `state store`) for the client; the adapter's error, with
    its addresses and driver text, is the cause, for the log only.
    """

    def __init__(self, service: str) -> None:
        super().__init__(f"{service} unavailable")
        self.service = service


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """Timers and sizes of a client's stream."""

    keepalive_s: float = 15.0
    max_wait_s: float = 300.0
    # A job not heard of for this long, without its end, is given up as idle.
    job_idle_s: float = 600.0
    # A stream that heard nothing of its job for this long reads the job's state again: an
    # end lost on its way from Redis still ends the stream.
    recheck_s: float = 60.0
    history_size: int = 100
    # A history whose payloads exceed this may have lost events to the byte cap (None: no cap).
    history_trimmed_above_bytes: int | None = None


class StreamJobEvents:
    """Write the SSE frames of one job for one client until the job ends, every frame through
    the connection's `FrameWriter`: one path whichever the connection (its own, shared by many
    jobs, UI message parts) and the one decision of how a live event goes (`ViewerQueue`).

    - Subscribe first, then read history and state: nothing published in between is lost.
    - Replay, in seq order, every history event after the client's Last-Event-ID (none: from
      the start); a snapshot first when the job is unknown or the history no longer reaches back.
    - A job's text: a client that missed tokens gets one `token_recovery` (the text up to
      its last token, read in one atomic step) in their place, among the stage events by id.
    - Then live events; an id at or below the last one sent on this connection is never sent.
      A live event whose previous id is past the last one sent (the client missed events:
      a router died between its apply and its publish, a message lost on the way), or one
      that restarts the text (a retried task), is preceded by a catch-up from the store.
    - A stream that heard nothing of its job for `recheck_s` catches up from the store: an
      end lost on its way from Redis still ends it.
    - After `done` or a failed event the stream ends; the writer keeps the connection alive
      (a keepalive comment whenever nothing was sent for `keepalive_s`);
      after `max_wait_s` without a terminal event, `event: error` with `timeout` and the end.
    - A job not heard of for `job_idle_s` without its end is idle (`job_end`): its end may
      have been lost (a failover that lost the last writes) or it was abandoned. A client
      that has its latest event gets `event: error` with `idle` and the end, at once on
      (re)connecting when the job is idle already, else once it becomes so while the stream
      waits; `already_ended` is then true. The job is last heard of when its latest stored
      event was written, or when a live event reached the stream; a stream of a job never
      heard of (unknown, expired) counts from its opening and just ends, like a timeout.
    - When the feed reports a gap (slow client, Pub/Sub reconnect): the history after the
      last event sent, by the same rule as a reconnect with that id: a snapshot first only
      when the history no longer reaches back to it, so the client is told of a real gap only.
    - When the feed closes (the process shuts down), the stream ends without an error: the
      client's EventSource reconnects with its Last-Event-ID, to another process.
    - `open` subscribes and reads the replay before returning, so an unreachable Pub/Sub or
      state store fails the request (`StreamUnavailable`) instead of cutting an open stream; one
      that fails later ends the stream (reason `error`) and the client resumes.
    - A stream that ends at `done` is closed with reason `done`; at a failed event, `failed`;
      for an idle job, `idle`.
    - Each open stream counts in `viewers` (its job's viewers on this process) from its opening
      until it ends, however it ends; events cost the count nothing.
    - `already_ended` tells, before any stream opens, whether a resuming client already has
      the job's terminal event or the latest event of an idle job, so the HTTP layer can
      tell it to stop reconnecting; `open_unless_ended` tells it from the read that gives
      the replay (one read of the store per open), opening nothing when it does.
    """

    def __init__(
        self,
        *,
        feed: EventFeed,
        store: StateStore,
        decoder: EventDecoder,
        clock: Clock,
        metrics: GatewayMetrics,
        limits: StreamLimits | None = None,
        viewers: ViewerTally | None = None,
    ) -> None:
        self._feed = feed
        self._viewers = viewers or ViewerTally()
        self._store = store
        self._decoder = decoder
        self._clock = clock
        self._metrics = metrics
        self._limits = limits or StreamLimits()
        self._idle_ms = round(self._limits.job_idle_s * 1000)
        self._recheck_ms = round(self._limits.recheck_s * 1000)

    async def already_ended(self, domain: str, job_id: str, last_event_id: int | None) -> bool:
        """True when the job has ended, or is idle, at or below `last_event_id`: nothing is
        left to send and nothing is coming."""
        if last_event_id is None:
            return False
        try:
            view = await self._store.view(domain, job_id)
        except TransientError as error:
            raise StreamUnavailable("state store") from error
        return self._ended_at(view, last_event_id)

    def _ended_at(self, view: JobView, last_event_id: int | None) -> bool:
        if last_event_id is None or missed_text(view.text_last_id, last_event_id):
            return False
        state = self._decoder.decode(view.state) if view.state is not None else None
        heard_ms = _latest(state.written_ms if state is not None else None, view.text_written_ms)
        return self._end(state, last_event_id, heard_ms) is not None

    async def open(self, domain: str, job_id: str, last_event_id: int | None = None) -> JobStream:
        """Subscribe and read the replay now, so that a Pub/Sub or state store outage is an
        error (`StreamUnavailable`) before any response starts, not a cut stream."""
        stream = await self._open(domain, job_id, last_event_id, unless_ended=False)
        assert stream is not None
        return stream

    async def open_unless_ended(
        self, domain: str, job_id: str, last_event_id: int | None = None
    ) -> JobStream | None:
        """`open`, or None when the client already has the job's end (`already_ended`),
        decided from the one read of the job that also gives the replay: a resuming client
        costs one read of the store, not two. An ended job's subscription is closed again."""
        return await self._open(domain, job_id, last_event_id, unless_ended=True)

    async def _open(
        self, domain: str, job_id: str, last_event_id: int | None, *, unless_ended: bool
    ) -> JobStream | None:
        try:
            subscription = await self._feed.subscribe(domain, job_id)
        except TransientError as error:
            raise StreamUnavailable("pubsub") from error
        cursor = _Cursor(last_event_id)
        try:
            view = await self._store.view(domain, job_id)
            if unless_ended and self._ended_at(view, last_event_id):
                await subscription.close()
                return None
            replay = await self._catch_up(domain, job_id, cursor, view=view)
        except TransientError as error:
            await subscription.close()
            raise StreamUnavailable("state store") from error
        except BaseException:
            await subscription.close()
            raise
        self._metrics.connection_opened()
        self._viewers.opened(domain, job_id)
        return JobStream(self, subscription, (domain, job_id), cursor, replay)

    async def __call__(
        self, domain: str, job_id: str, last_event_id: int | None = None
    ) -> AsyncIterator[bytes]:
        stream = await self.open(domain, job_id, last_event_id)
        try:
            async for frame in stream:
                yield frame
        finally:
            await stream.aclose()

    async def _run(self, stream: JobStream, writer: FrameWriter) -> None:
        subscription, cursor = stream.subscription, stream.cursor
        domain, job_id = stream.job
        replay, stream.replay = stream.replay, []
        try:
            if replay:
                await _send(writer, replay)
            if cursor.ended:
                stream.reason = cursor.ended
                return
            started = self._clock.monotonic()
            # A job never heard of is given up as idle counting from here.
            opened_ms = self._clock.now_ms()
            subscription.write_through(partial(self._write_through, cursor, writer))
            # The connection keeps itself alive: on thousands of idle streams, a wake-up of
            # each one's task per keepalive was most of the gateway's idle CPU.
            writer.keep_alive(self._limits.keepalive_s)
            while True:
                wait_left = started + self._limits.max_wait_s - self._clock.monotonic()
                if wait_left <= 0:
                    await _send(writer, [notice("timeout")])
                    stream.reason = "timeout"
                    return
                # The same wait, cut short at the idle limit: no timer of its own.
                heard_ms = opened_ms if cursor.heard_ms is None else cursor.heard_ms
                idle_left = idle_left_ms(
                    last_heard_ms=heard_ms,
                    now_ms=self._clock.now_ms(),
                    idle_after_ms=self._idle_ms,
                )
                if idle_left <= 0:
                    await _send(writer, [IDLE_NOTICE])
                    stream.reason = IDLE
                    return
                checked_ms = max(heard_ms, cursor.checked_ms)
                recheck_left = checked_ms + self._recheck_ms - self._clock.now_ms()
                if recheck_left <= 0:
                    frames = await self._catch_up(domain, job_id, cursor, recheck=True)
                    if frames:
                        await _send(writer, frames)
                    if cursor.ended:
                        stream.reason = cursor.ended
                        return
                    continue
                item = await subscription.next(
                    min(wait_left, idle_left / 1000, recheck_left / 1000)
                )
                if item is None:
                    continue
                if isinstance(item, FeedClosed):
                    stream.reason = "shutdown"
                    return
                if isinstance(item, FeedGap):
                    frames = await self._catch_up(domain, job_id, cursor)
                else:
                    frames = await self._live_or_catch_up(domain, job_id, item, cursor)
                    # Events already queued go out in the same write: a viewer that fell
                    # behind catches up in one send instead of one per event.
                    while not cursor.ended and (more := subscription.next_nowait()) is not None:
                        frames += await self._live_or_catch_up(domain, job_id, more, cursor)
                if frames:
                    await _send(writer, frames)
                if cursor.ended:
                    stream.reason = cursor.ended
                    return
        except TransientError as error:
            # The client's EventSource reconnects with its Last-Event-ID once the stream ends.
            log.warning("ending the stream of job %s: %s", job_id, error)
            stream.reason = "error"
        finally:
            subscription.write_through(None)
            writer.stop_keepalive()
            await stream.release()

    def _closed(self, stream: JobStream) -> None:
        self._metrics.connection_closed(stream.reason)
        self._viewers.closed(*stream.job)

    async def _live_or_catch_up(
        self, domain: str, job_id: str, event: GatewayEvent, cursor: _Cursor
    ) -> list[Frame]:
        """The live event's frame; first a catch-up from the store when it tells that the
        client missed events before it (the event itself is sent after, if the store did
        not have it yet)."""
        if not missed_before(event, cursor.last_sent):
            return self._live(event, cursor)
        frames = await self._catch_up(domain, job_id, cursor)
        if not cursor.ended:
            frames += self._live(event, cursor)
        return frames

    async def _catch_up(
        self,
        domain: str,
        job_id: str,
        cursor: _Cursor,
        *,
        recheck: bool = False,
        view: JobView | None = None,
    ) -> list[Frame]:
        """The frames the client missed, read from the store (or from `view`, read just now).
        A re-check of a quiet stream sends only what is new: the client was told at its
        opening of a job still unknown."""
        # One re-read per quiet spell, not one per turn of the wait.
        cursor.checked_ms = self._clock.now_ms()
        if view is None:
            view = await self._store.view(domain, job_id)
        history = [e for e in map(self._decoder.decode, view.history) if e is not None]
        state = self._decoder.decode(view.state) if view.state is not None else None
        recovery = None
        if missed_text(view.text_last_id, cursor.last_sent):
            text = await self._store.text(domain, job_id)
            if text is not None:
                recovery = text_recovery(text, job_id, state)
        plan = plan_replay(
            last_event_id=cursor.last_sent,
            history=history,
            state=state,
            history_size=self._limits.history_size,
            history_bytes=sum(map(len, view.history)),
            trimmed_above_bytes=self._limits.history_trimmed_above_bytes,
            recovery=recovery,
        )
        frames = []
        if plan.snapshot and not (recheck and state is None):
            frames.append(snapshot(state, job_id))
            self._metrics.snapshot_sent()
        sent = 0
        for event in plan.events:
            if cursor.take(event):
                frames.append(live_frame(event))
                sent += 1
                if cursor.ended:
                    break
        if sent:
            self._metrics.events_sent(sent, replayed=True)
        written_ms = _latest(state.written_ms if state is not None else None, view.text_written_ms)
        if written_ms is not None:
            cursor.heard_ms = max(written_ms, cursor.heard_ms or 0)
        if cursor.ended is None:
            # The client already has the end of this job, or the latest event of an idle one.
            cursor.ended = self._end(state, cursor.last_sent, cursor.heard_ms)
            if cursor.ended == IDLE:
                frames.append(IDLE_NOTICE)
        return frames

    def _end(
        self, state: GatewayEvent | None, last_sent: int | None, heard_ms: int | None
    ) -> str | None:
        return job_end(
            state,
            last_sent,
            last_heard_ms=heard_ms,
            now_ms=self._clock.now_ms(),
            idle_after_ms=self._idle_ms,
        )

    def _write_through(self, cursor: _Cursor, writer: FrameWriter, live: LiveEvent) -> bool:
        """A live event written at once, from the feed's fan-out, while the stream waits: no
        task switch per viewer, and only what differs per viewer (is it past this id, can
        the connection take it, the write); the clock and the metrics are once per event
        (`_report_live`). A terminal event still goes through the queue: the stream ends with
        it; so does one that tells the client missed events: it needs the store."""
        event = live.event
        if event.terminal or not writer.writable() or missed_before(event, cursor.last_sent):
            return False
        if not cursor.take(event):
            if cursor.overtaken(event):
                self._metrics.event_overtaken()
            return True
        now_ms = live.now_ms
        if now_ms is None:
            now_ms = live.now_ms = self._clock.now_ms()
            live.report = self._report_live
        # Heard of now: an event routed late (written long ago) is still a sign of life.
        cursor.heard_ms = now_ms
        writer.write(live.frame)
        live.written += 1
        return True

    def _report_live(self, live: LiveEvent) -> None:
        """The viewers a live event was written through to, counted in one go: one latency
        for all of them (they were written in the same turn)."""
        self._metrics.events_sent(live.written, replayed=False)
        written_ms = live.event.written_ms
        if written_ms is not None and live.now_ms is not None:
            self._metrics.delivered(max(0.0, float(live.now_ms - written_ms)))

    def _live(self, event: GatewayEvent, cursor: _Cursor) -> list[Frame]:
        if not cursor.take(event):
            if cursor.overtaken(event):
                self._metrics.event_overtaken()
            return []
        now_ms = self._clock.now_ms()
        # Heard of now: an event routed late (written long ago) is still a sign of life.
        cursor.heard_ms = now_ms
        self._metrics.events_sent(1, replayed=False)
        if event.written_ms is not None:
            self._metrics.delivered(max(0.0, float(now_ms - event.written_ms)))
        return [live_frame(event)]


async def _send(writer: FrameWriter, frames: Sequence[Frame]) -> None:
    """Frames from the stream's task: once the connection takes them, in one write."""
    if not writer.writable():
        await writer.drained()
    writer.write_all(frames)


def _latest(*times_ms: int | None) -> int | None:
    known = [t for t in times_ms if t is not None]
    return max(known) if known else None


class JobStream:
    """One client's open stream of a job: `run` writes its frames to a writer until it ends
    (iterating it does the same through a `FrameBuffer`); `aclose` ends it.

    Ending it releases the subscription, counts the connection closed and the viewer gone,
    exactly once, whether or not it ever ran. It holds what its run needs, and nothing made
    for it alone (a closure, a partial): thousands of them wait at once.
    """

    __slots__ = (
        "_chunks",
        "_released",
        "_use_case",
        "cursor",
        "job",
        "reason",
        "replay",
        "subscription",
    )

    def __init__(
        self,
        use_case: StreamJobEvents,
        subscription: FeedSubscription,
        job: tuple[str, str],
        cursor: _Cursor,
        replay: list[Frame],
    ) -> None:
        self.reason = "disconnect"
        self._use_case = use_case
        self.subscription = subscription
        self.job = job
        self.cursor = cursor
        # The frames read at the opening, until the run writes them.
        self.replay = replay
        self._released = False
        self._chunks: AsyncGenerator[bytes] | None = None

    def run(self, writer: FrameWriter) -> Coroutine[Any, Any, None]:
        """Write every frame of the stream to `writer`, until it ends: the use case's own
        coroutine, with no frame of this one."""
        return self._use_case._run(self, writer)

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._chunks = FrameBuffer().chunks(self.run)
        return self._chunks

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()
        await self.release()

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        # Counted first: a disconnected client's task is cancelled, which can cut the
        # await below short.
        self._use_case._closed(self)
        await self.subscription.close()


class RecentIds:
    """The ids a connection sent lately, to tell a refused live event it got (a repeat) from
    one it never got (overtaken by a newer one). Ids are sent in increasing order; only the
    latest `keep` to `2 * keep` are kept, packed, so a long stream (a chat answer's thousands
    of tokens) holds about a kilobyte, not every id it ever sent."""

    __slots__ = ("_forgot_below", "_ids", "_keep")

    def __init__(self, first: int, *, keep: int = 64) -> None:
        assert keep > 0
        self._ids = array("q", (first,))
        self._keep = keep
        # Ids below this may have been sent and forgotten: whether one was sent is unknown.
        self._forgot_below: int | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, event_id: int) -> None:
        ids = self._ids
        ids.append(event_id)
        if len(ids) >= 2 * self._keep:
            del ids[: -self._keep]
            self._forgot_below = ids[0]

    def never_sent(self, event_id: int) -> bool | None:
        """Whether `event_id` was never sent here; None when it is older than what is kept."""
        if self._forgot_below is not None and event_id < self._forgot_below:
            return None
        return event_id not in self._ids


class _Cursor:
    """The last event id sent on this connection, what it sent lately, when the job was last
    heard of (wall-clock ms, None until known) and how the stream ended."""

    __slots__ = ("_resumed_after", "_sent", "checked_ms", "ended", "heard_ms", "last_sent")

    def __init__(self, last_event_id: int | None) -> None:
        self.last_sent = last_event_id
        self.ended: str | None = None
        self.heard_ms: int | None = None
        # When the store was last read for this stream (wall-clock ms).
        self.checked_ms = 0
        self._resumed_after = last_event_id
        # Made at the first event sent: many streams wait long before theirs.
        self._sent: RecentIds | None = None

    def take(self, event: GatewayEvent) -> bool:
        if self.last_sent is not None and event.event_id <= self.last_sent:
            return False
        self.last_sent = event.event_id
        if self._sent is None:
            self._sent = RecentIds(event.event_id)
        else:
            self._sent.add(event.event_id)
        if event.terminal:
            self.ended = end_reason(event)
        return True

    def overtaken(self, event: GatewayEvent) -> bool:
        """A refused event this client never got, from after its resume point: it missed it.
        One older than the sent ids kept is not counted: far more often a late repeat of an
        event sent long ago (a publish retried on redelivery) than one never sent."""
        after_resume = self._resumed_after is None or event.event_id > self._resumed_after
        return after_resume and (
            self._sent is None or self._sent.never_sent(event.event_id) is True
        )
