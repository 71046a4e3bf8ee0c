"""Use case: stream the events of many jobs to one client on one SSE connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from eco_router.application.frame_buffer import FrameBuffer
from eco_router.application.ports import FrameWriter
from eco_router.application.stream_job_events import JobStream, StreamJobEvents
from eco_router.domain.job_set import JobSet, encode_seq, stream_id
from eco_router.domain.multiplexed_frames import job_frame
from eco_router.domain.sse import IDLE, Frame

log = logging.getLogger(__name__)

# A job whose stream ended so leaves the set; any other end (a store error, shutdown) ends
# the connection, and the client resumes every job from its Last-Event-ID.
LEAVES = frozenset({"done", "failed", IDLE, "timeout"})


class StreamManyJobs:
    """Yield the SSE frames of a set of jobs for one client, each job's frames as its own
    stream (`StreamJobEvents`) has them, retold with the job named and the set's stream id.

    - Each job is one `StreamJobEvents` stream, opened from its own position: everything a
      single job's stream guarantees (replay after the position, a snapshot when the history
      no longer reaches back, `token_recovery`, catch-up on gaps, no duplicate, order) holds
      per job; each counts as a viewer of its job, and in the gateway's stream metrics.
    - Every frame carries the stream id: each job's last event id sent, in the set's order,
      so a reconnect with it resumes every job where it stood. It is taken as frames are
      retold, in the order they are written: a frame never names a position whose events
      went out after it.
    - A job already ended at its position (`already_ended`) is not opened; when all are,
      there is nothing to stream (`open` returns None).
    - A job whose stream ends at its end (`done`, failed, `idle`) or gives up (`timeout`)
      leaves the set; the stream ends when every job has left. A job's stream that ends
      otherwise (a store error, the process shutting down) ends the whole stream: the client
      resumes all of them from its Last-Event-ID, as it would each one alone.
    - One frame path: each job's stream writes through the connection (`_SharedConnection`),
      its frames retold as they are written, so the order of writes is the order of ids; a
      live event goes straight from the feed's fan-out while the connection takes it, as on
      a job's own connection. Bounded as alone: a job whose client is slow waits for the
      connection to drain, its own queue drops and it catches up from the history.
    - One keepalive for the connection, not one per job.
    """

    def __init__(self, *, jobs: StreamJobEvents, keepalive_s: float) -> None:
        self._jobs = jobs
        self._keepalive_s = keepalive_s

    async def open(self, job_set: JobSet, positions: Sequence[int | None]) -> ManyJobsStream | None:
        """Open the stream of every job not yet ended at its position, subscribed and with
        its replay read (`StreamUnavailable` otherwise, with nothing left open); None when
        every job has ended for this client."""
        ended = await asyncio.gather(
            *(
                self._jobs.already_ended(domain, job_id, position)
                for (domain, job_id), position in zip(job_set.jobs, positions, strict=True)
            )
        )
        indexes = [i for i, done in enumerate(ended) if not done]
        if not indexes:
            return None
        streams = await self._open_all(job_set, positions, indexes)
        return ManyJobsStream(job_set, positions, streams, keepalive_s=self._keepalive_s)

    async def _open_all(
        self, job_set: JobSet, positions: Sequence[int | None], indexes: list[int]
    ) -> dict[int, JobStream]:
        """Opened together, so that their subscriptions and replays share round trips."""
        tasks = {
            i: asyncio.create_task(self._jobs.open(*job_set.jobs[i], positions[i])) for i in indexes
        }
        whole = False
        try:
            await asyncio.wait(tasks.values())
            whole = True
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.wait(tasks.values())
            opened = {
                i: t.result() for i, t in tasks.items() if not t.cancelled() and not t.exception()
            }
            errors = [t.exception() for t in tasks.values() if not t.cancelled()]
            failure = next((e for e in errors if e is not None), None)
            if not whole or failure is not None:
                for stream in opened.values():
                    await stream.aclose()
        if failure is not None:
            raise failure
        return opened


class _SharedConnection(FrameWriter):
    """The connection as one job's stream on it sees it: the job's frames are retold (its
    name, the set's stream id) as they are written, in the order they are written; the
    connection keeps itself alive once, for every job."""

    __slots__ = ("_index", "_many", "_writer")

    def __init__(self, many: ManyJobsStream, index: int, writer: FrameWriter) -> None:
        self._many = many
        self._index = index
        self._writer = writer

    def writable(self) -> bool:
        return self._writer.writable()

    async def drained(self) -> None:
        await self._writer.drained()

    def write(self, frame: Frame) -> None:
        self._writer.write_all([self._many.retell(self._index, frame)])

    def write_all(self, frames: Sequence[Frame]) -> None:
        self._writer.write_all([self._many.retell(self._index, frame) for frame in frames])

    def keep_alive(self, every_s: float) -> None:
        return None

    def stop_keepalive(self) -> None:
        return None


class ManyJobsStream:
    """One client's open stream of many jobs: `run` writes every job's frames to a writer
    until every job has left (iterating it does the same through a `FrameBuffer`); `aclose`
    ends it and every job's stream, however far it got."""

    def __init__(
        self,
        job_set: JobSet,
        positions: Sequence[int | None],
        streams: dict[int, JobStream],
        *,
        keepalive_s: float,
    ) -> None:
        self.reason = "disconnect"
        self._set = job_set
        self._parts = [encode_seq(p) for p in positions]
        self._streams = streams
        self._keepalive_s = keepalive_s
        self._runs: list[asyncio.Task[None]] = []
        self._chunks: AsyncGenerator[bytes] | None = None

    @property
    def jobs(self) -> int:
        """How many jobs are watched on it (those not already ended when it opened)."""
        return len(self._streams)

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._chunks = FrameBuffer().chunks(self.run)
        return self._chunks

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()
        await self._stop()

    async def run(self, writer: FrameWriter) -> None:
        """Every job's stream, each in its own task, writing through the one connection."""
        runs = {
            asyncio.create_task(stream.run(_SharedConnection(self, i, writer))): stream
            for i, stream in self._streams.items()
        }
        self._runs = list(runs)
        writer.keep_alive(self._keepalive_s)
        try:
            running = set(runs)
            while running:
                ended, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for run in ended:
                    run.result()  # a job's stream that failed fails the connection's
                    if runs[run].reason not in LEAVES:
                        self.reason = runs[run].reason
                        return
            self.reason = "done"
        finally:
            writer.stop_keepalive()
            await self._stop()

    def retell(self, i: int, frame: Frame) -> Frame:
        """Job `i`'s frame as this connection sends it, the set's stream id taken now."""
        if frame.event_id is not None:
            self._parts[i] = encode_seq(frame.event_id)
        domain, job_id = self._set.jobs[i]
        return job_frame(
            frame, domain=domain, job_id=job_id, stream_id=stream_id(self._set, self._parts)
        )

    async def _stop(self) -> None:
        for run in self._runs:
            run.cancel()
        if self._runs:
            await asyncio.wait(self._runs)
        for stream in self._streams.values():
            try:
                await stream.aclose()
            except Exception:
                log.exception("closing a job's stream on a shared connection failed")
