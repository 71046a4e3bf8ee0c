"""Use case: stream the events of many jobs to one client on one SSE connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from eco_router.application.ports import FrameWriter
from eco_router.application.stream_job_events import JobStream, StreamJobEvents
from eco_router.domain.job_set import JobSet, encode_seq, stream_id
from eco_router.domain.multiplexed_frames import job_frame, read_frames
from eco_router.domain.sse import IDLE, KEEPALIVE_FRAME

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
    - Bounded: at most one chunk per job waits to be written; a job whose client is slow
      waits, its own queue drops and it catches up from the history, as alone.
    - While the stream waits with nothing pending, a job's live event is retold and written
      straight to the connection from the feed's fan-out (no task switch), as on a job's own
      connection; anything else goes through the queue, so the order of writes is kept.
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


@dataclass(slots=True)
class _Ended:
    reason: str


class _UnwrittenFrames(FrameWriter):
    """What a job's stream on a shared connection writes through: nothing. Its live events go
    through its queue and are retold in order; the connection keeps itself alive once."""

    def writable(self) -> bool:
        return False

    def write(self, frame: bytes) -> None:
        raise AssertionError("never writable")

    def keep_alive(self, every_s: float, frame: bytes) -> None:
        return None

    def stop_keepalive(self) -> None:
        return None


UNWRITTEN = _UnwrittenFrames()


class _SharedConnection(FrameWriter):
    """What a job's stream on a shared connection writes its live events through: retold
    and written at once while the stream of many jobs waits with nothing pending, so a live
    event costs no task switch, as on a job's own connection; else refused, and queued."""

    __slots__ = ("_index", "_many")

    def __init__(self, many: ManyJobsStream, index: int) -> None:
        self._many = many
        self._index = index

    def writable(self) -> bool:
        return self._many.writes_through()

    def write(self, frame: bytes) -> None:
        self._many.write_through(self._index, frame)

    def keep_alive(self, every_s: float, frame: bytes) -> None:
        return None

    def stop_keepalive(self) -> None:
        return None


class ManyJobsStream:
    """One client's open stream of many jobs: iterate it for its frames; `aclose` ends it and
    every job's stream, however far it got."""

    def __init__(
        self,
        job_set: JobSet,
        positions: Sequence[int | None],
        streams: dict[int, JobStream],
        *,
        keepalive_s: float,
    ) -> None:
        self.reason = "disconnect"
        # Set before iterating: the connection's keepalives are then kept by it.
        self.writer: FrameWriter | None = None
        self._set = job_set
        self._parts = [encode_seq(p) for p in positions]
        self._streams = streams
        self._keepalive_s = keepalive_s
        self._pumps: list[asyncio.Task[None]] = []
        # At most one chunk per job waits here: a job's stream that gets ahead waits its turn.
        self._queue: asyncio.Queue[tuple[int, bytes | _Ended | BaseException]] = asyncio.Queue(
            maxsize=len(streams)
        )
        # True only while the stream waits for a chunk, everything before it written.
        self._idle = False
        self._frames = self._run()

    @property
    def jobs(self) -> int:
        """How many jobs are watched on it (those not already ended when it opened)."""
        return len(self._streams)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._frames

    async def aclose(self) -> None:
        await self._frames.aclose()
        await self._stop()

    def writes_through(self) -> bool:
        """Whether a job's live frame may be written now, in order: nothing is pending and the
        connection takes it."""
        return (
            self._idle
            and self._queue.empty()
            and self.writer is not None
            and self.writer.writable()
        )

    def write_through(self, i: int, chunk: bytes) -> None:
        assert self.writer is not None
        self.writer.write_own(self._retell(i, chunk))

    async def _run(self) -> AsyncGenerator[bytes]:
        writer = self.writer
        queue = self._queue
        for i, stream in self._streams.items():
            stream.writer = UNWRITTEN if writer is None else _SharedConnection(self, i)
        self._pumps = [
            asyncio.create_task(self._pump(i, stream, queue)) for i, stream in self._streams.items()
        ]
        if writer is not None:
            writer.keep_alive(self._keepalive_s, KEEPALIVE_FRAME)
        left = set(self._streams)
        try:
            while left:
                if writer is None:
                    try:
                        async with asyncio.timeout(self._keepalive_s):
                            item = await queue.get()
                    except TimeoutError:
                        yield KEEPALIVE_FRAME
                        continue
                else:
                    self._idle = True
                    try:
                        item = await queue.get()
                    finally:
                        self._idle = False
                out = []
                while True:
                    i, got = item
                    if isinstance(got, _Ended):
                        left.discard(i)
                        if got.reason not in LEAVES:
                            self.reason = got.reason
                            left.clear()
                            break
                    elif isinstance(got, BaseException):
                        raise got
                    else:
                        out.append(self._retell(i, got))
                    try:
                        item = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                if out:
                    yield b"".join(out)
            if self.reason == "disconnect":
                self.reason = "done"
        finally:
            if writer is not None:
                writer.stop_keepalive()
            await self._stop()

    def _retell(self, i: int, chunk: bytes) -> bytes:
        domain, job_id = self._set.jobs[i]
        out = []
        for frame in read_frames(chunk):
            if frame.event_id is not None:
                self._parts[i] = encode_seq(frame.event_id)
            out.append(
                job_frame(
                    frame, domain=domain, job_id=job_id, stream_id=stream_id(self._set, self._parts)
                )
            )
        return b"".join(out)

    @staticmethod
    async def _pump(
        i: int, stream: JobStream, queue: asyncio.Queue[tuple[int, bytes | _Ended | BaseException]]
    ) -> None:
        """One job's frames into the shared queue, then how its stream ended; an error is
        handed on to be raised by the stream's reader, never lost."""
        ended: _Ended | BaseException
        try:
            async for chunk in stream:
                await queue.put((i, chunk))
            ended = _Ended(stream.reason)
        except Exception as error:
            ended = error
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Stopped while the job's stream was closing, and its close swallowed the cancel:
            # no reader is left to take the end, and the queue may be full.
            if isinstance(ended, BaseException):
                log.error("a job's stream failed as its connection closed", exc_info=ended)
            return
        await queue.put((i, ended))

    async def _stop(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        if self._pumps:
            await asyncio.wait(self._pumps)
        for stream in self._streams.values():
            try:
                await stream.aclose()
            except Exception:
                log.exception("closing a job's stream on a shared connection failed")
