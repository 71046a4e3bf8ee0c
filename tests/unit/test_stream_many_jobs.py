"""StreamManyJobs on the in-memory adapters: many jobs on one stream, each as alone, and a
stream id that resumes every job exactly."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eco_router.application.errors import TransientError
from eco_router.application.ports import FrameWriter
from eco_router.application.presence import ViewerTally
from eco_router.application.stream_job_events import StreamJobEvents
from eco_router.application.stream_many_jobs import ManyJobsStream, StreamManyJobs
from eco_router.domain.job_set import JobSet, read_stream_id
from tests.unit.test_stream_job_events import Gateway

DONE = {"stage": "done", "status": "done"}
# A stream that should deliver is given this long before the test says it hangs.
HANGS_AFTER_S = 5.0


@dataclass(frozen=True)
class Frame:
    """One frame of a stream of many jobs, read as a browser would."""

    stream_id: str
    event: str
    job: tuple[str, str]
    data: dict[str, object]

    @property
    def event_id(self) -> int | None:
        seq = self.data.get("seq")
        return seq if isinstance(seq, int) else None


def frames_of(chunk: bytes) -> list[Frame]:
    frames = []
    for text in chunk.decode().split("\n\n"):
        if not text or text.startswith(":"):
            continue
        fields = dict(line.split(": ", 1) for line in text.split("\n"))
        body = orjson.loads(fields["data"])
        assert set(body) == {"domain", "job_id", "data"}, text
        frames.append(
            Frame(fields["id"], fields["event"], (body["domain"], body["job_id"]), body["data"])
        )
    return frames


def many(gw: Gateway, viewers: ViewerTally | None = None) -> StreamManyJobs:
    jobs = gw.stream
    if viewers is not None:
        jobs = StreamJobEvents(
            feed=gw.feed,
            store=gw.h.store,
            decoder=gw.decoder,
            clock=gw.h.clock,
            metrics=gw.metrics,
            limits=gw.limits,
            viewers=viewers,
        )
    return StreamManyJobs(jobs=jobs, keepalive_s=15.0)


class Connection(FrameWriter):
    """A client's connection as the HTTP server hands it to the stream: what is written to
    it goes out in order with the stream's own chunks."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def writable(self) -> bool:
        return True

    def write(self, frame: bytes) -> None:
        self._client.arrive(frame)

    def keep_alive(self, every_s: float, frame: bytes) -> None:
        pass

    def stop_keepalive(self) -> None:
        pass


@dataclass
class Client:
    """A browser's EventSource on a stream of many jobs: it keeps the last id it got and
    reconnects with it. `direct`: its connection takes live frames straight from the
    fan-out, as the HTTP server's does."""

    use_case: StreamManyJobs
    job_set: JobSet
    direct: bool = False
    last_id: str | None = None
    got: list[Frame] = field(default_factory=list)
    stream: ManyJobsStream | None = None
    # What reached the connection, in order, not read yet; None: the stream ended.
    _wire: list[bytes | None] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    async def connect(self) -> bool:
        """False when the gateway answers that every job has ended (204)."""
        positions = (
            read_stream_id(self.job_set, self.last_id)
            if self.last_id
            else [None] * len(self.job_set)
        )
        self.stream = await self.use_case.open(self.job_set, positions)
        if self.stream is None:
            return False
        if self.direct:
            self.stream.writer = Connection(self)
        self._wire.clear()
        self._reader = asyncio.create_task(self._read(self.stream))
        return True

    def arrive(self, chunk: bytes | None) -> None:
        self._wire.append(chunk)
        self._arrived.set()

    async def _read(self, stream: ManyJobsStream) -> None:
        async for chunk in stream:
            self.arrive(chunk)
        self.arrive(None)

    async def read(self, *, keep: int | None = None) -> list[Frame] | None:
        """The next chunk's frames (None: the stream ended); with `keep`, the connection is
        cut after that many of them, as a cut mid-write would."""
        async with asyncio.timeout(HANGS_AFTER_S):
            while not self._wire:
                self._arrived.clear()
                await self._arrived.wait()
        chunk = self._wire.pop(0)
        if chunk is None:
            return None
        frames = frames_of(chunk)
        if keep is not None:
            frames = frames[:keep]
        for frame in frames:
            self.got.append(frame)
            self.last_id = frame.stream_id
        if keep is not None:
            await self.disconnect()
        return frames

    async def disconnect(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.stream is not None:
            await self.stream.aclose()
        self.stream = self._reader = None
        self._wire.clear()

    def seqs(self, job: tuple[str, str]) -> list[int]:
        return [f.event_id for f in self.got if f.job == job and f.event_id is not None]


JOBS = JobSet.of([("scan", "job-b"), ("scan", "job-a"), ("scan", "job-c")])


@pytest.fixture
async def gw() -> Gateway:
    gateway = Gateway()
    await gateway.h.source.prepare()
    return gateway


class TestManyJobsOnOneStream:
    async def test_each_frame_names_its_job_and_where_every_job_stood(self, gw: Gateway) -> None:
        await gw.produce("job-a", 1, 2)
        await gw.produce("job-c", 1)
        client = Client(many(gw), JOBS)
        assert await client.connect()
        frames: list[Frame] = []
        while len([f for f in frames if f.event_id]) < 3:
            frames += await client.read() or []
        events = [(f.job[1], f.event_id) for f in frames if f.event_id]
        assert sorted(events) == [("job-a", 1), ("job-a", 2), ("job-c", 1)]
        # job-b is unknown: a snapshot with no state, as alone.
        assert [f.data for f in frames if f.event == "snapshot"] == [
            {"job_id": "job-b", "state": None}
        ]
        assert read_stream_id(JOBS, client.last_id or "") == [2, None, 1]
        await client.disconnect()

    async def test_live_events_of_every_job_follow_in_order(self, gw: Gateway) -> None:
        client = Client(many(gw), JOBS)
        assert await client.connect()
        await client.read()  # the three snapshots of jobs not started
        for seq in (1, 2, 3):
            for job in ("job-a", "job-b", "job-c"):
                await gw.produce(job, seq)
        while len([f for f in client.got if f.event_id]) < 9:
            await client.read()
        for job in JOBS.jobs:
            assert client.seqs(job) == [1, 2, 3]
        await client.disconnect()

    async def test_a_reconnect_with_the_last_id_resumes_every_job_exactly(
        self, gw: Gateway
    ) -> None:
        await gw.produce("job-a", 1, 2)
        await gw.produce("job-b", 1)
        client = Client(many(gw), JOBS)
        assert await client.connect()
        await client.read()
        await client.disconnect()
        await gw.produce("job-a", 3)
        await gw.produce("job-c", 1, 2)
        assert await client.connect()
        while len([f for f in client.got if f.event_id]) < 6:
            await client.read()
        assert client.seqs(("scan", "job-a")) == [1, 2, 3]
        assert client.seqs(("scan", "job-b")) == [1]
        assert client.seqs(("scan", "job-c")) == [1, 2]
        await client.disconnect()

    async def test_jobs_that_end_leave_and_the_stream_ends_with_the_last(self, gw: Gateway) -> None:
        client = Client(many(gw), JOBS)
        assert await client.connect()
        await client.read()
        await gw.produce("job-a", 1, **DONE)
        await gw.produce("job-b", 1, **DONE)
        await gw.produce("job-c", 1)
        await gw.produce("job-c", 2, **DONE)
        while await client.read() is not None:
            pass
        assert [f.event for f in client.got if f.event_id].count("done") == 3
        assert client.stream is not None
        assert client.stream.reason == "done"
        await client.disconnect()
        # The browser reconnects once the stream ends: every job has ended (204).
        assert not await client.connect()

    async def test_jobs_already_ended_at_the_resume_point_are_not_opened(self, gw: Gateway) -> None:
        await gw.produce("job-a", 1, **DONE)
        positions = [1, None, None]
        stream = await many(gw).open(JOBS, positions)
        assert stream is not None
        assert stream.jobs == 2
        await stream.aclose()

    async def test_each_job_counts_as_a_viewer_until_the_stream_closes(self, gw: Gateway) -> None:
        viewers = ViewerTally()
        client = Client(many(gw, viewers), JOBS)
        assert await client.connect()
        assert viewers.counts() == {job: 1 for job in JOBS.jobs}
        assert gw.metrics.active == 3
        await client.read()
        await gw.produce("job-a", 1, **DONE)
        while not any(f.event == "done" for f in client.got):
            await client.read()
        await asyncio.sleep(0)
        assert viewers.counts() == {("scan", "job-b"): 1, ("scan", "job-c"): 1}
        await client.disconnect()
        assert viewers.counts() == {}
        assert gw.metrics.active == 0

    async def test_a_stream_closed_before_it_is_read_releases_every_job(self, gw: Gateway) -> None:
        viewers = ViewerTally()
        stream = await many(gw, viewers).open(JOBS, [None, None, None])
        assert stream is not None
        await stream.aclose()
        assert viewers.counts() == {}
        assert gw.metrics.active == 0


# --- any cut, any reconnect -----------------------------------------------------------------

job_counts = st.integers(min_value=1, max_value=4)


@st.composite
def plays(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """Events per job (the last one `done`), the order they are produced in (job indexes),
    and after how many frames of each connection the client cuts it."""
    lengths = draw(st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=4))
    order = draw(st.permutations([i for i, n in enumerate(lengths) for _ in range(n)]))
    cuts = draw(st.lists(st.integers(min_value=0, max_value=4), max_size=8))
    return lengths, list(order), cuts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(play=plays(), produce_first=st.integers(min_value=0, max_value=20), direct=st.booleans())
def test_a_client_cut_anywhere_gets_every_jobs_events_once_in_order(
    play: tuple[list[int], list[int], list[int]], produce_first: int, direct: bool
) -> None:
    """Some events are in the history before the client connects, the rest arrive live; the
    client's connection is cut after any number of frames of a chunk (zero: at once), and it
    reconnects with the last stream id it got, until the stream ends with every job's `done`.
    `direct`: live frames are written straight to the connection while the stream waits."""
    asyncio.run(_play(*play, produce_first=produce_first, direct=direct))


async def _play(
    lengths: list[int], order: list[int], cuts: list[int], *, produce_first: int, direct: bool
) -> None:
    gw = Gateway()
    await gw.h.source.prepare()
    names = [f"job-{i}" for i in range(len(lengths))]
    job_set = JobSet.of(("scan", name) for name in names)
    produced = [0] * len(lengths)

    async def produce_next(step: int) -> None:
        i = order[step]
        produced[i] += 1
        fields = DONE if produced[i] == lengths[i] else {}
        await gw.produce(names[i], produced[i], **fields)

    steps = iter(range(len(order)))
    for step in steps:
        if step >= produce_first:
            await produce_next(step)
            break
        await produce_next(step)
    client = Client(many(gw), job_set, direct=direct)
    pending_cuts = list(cuts)
    connected = await client.connect()
    while connected:
        # One event produced per chunk read: a read never waits for an event not coming.
        step = next(steps, None)
        if step is not None:
            await produce_next(step)
        keep = pending_cuts.pop(0) if pending_cuts else None
        frames = await client.read(keep=keep)
        if keep is not None:
            connected = await client.connect()
        elif frames is None:
            await client.disconnect()
            assert not await client.connect(), "a stream ended before every job had"
            connected = False
    for i, name in enumerate(names):
        assert client.seqs(("scan", name)) == list(range(1, lengths[i] + 1))
    # Nothing was lost that a snapshot would have to stand for.
    assert all(f.data.get("state") is None for f in client.got if f.event == "snapshot")


class TestOutages:
    async def test_an_unreachable_store_fails_the_opening_and_leaves_nothing_open(
        self, gw: Gateway
    ) -> None:
        viewers = ViewerTally()
        gw.h.store.available = False

        with pytest.raises(TransientError):
            await many(gw, viewers).open(JOBS, [None, None, None])

        assert viewers.counts() == {}
        assert gw.metrics.active == 0

    async def test_a_job_whose_catch_up_fails_ends_the_whole_stream_for_a_resume(self) -> None:
        gw = Gateway(queue_size=2)
        await gw.h.source.prepare()
        client = Client(many(gw), JOBS)
        assert await client.connect()
        await client.read()  # the snapshots
        # More than the job's queue holds: its stream must catch up from the store.
        await gw.produce("job-a", 1, 2, 3, 4, 5, 6)
        gw.h.store.available = False
        while await client.read() is not None:
            pass

        assert client.stream is not None
        assert client.stream.reason == "error"
        await client.disconnect()
        assert gw.metrics.active == 0
