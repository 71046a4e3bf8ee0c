"""Any interleaving of a chat answer's faults ends with every viewer holding the final
attempt's text, and `done` once: the router on its in-memory adapters and the SSE use case,
driven by hypothesis.

The task writes the reference worker's entries (stage seqs below 1000, tokens from 1001) and
may write an entry twice (a producer's retry, or a duplicated entry, of any earlier entry:
an older attempt's comes back stale) or be retried (a higher `attempt`, tokens from 1001
again, a new text). A router routes a batch, or dies: after reading, after its apply, part-way
through its publish, or after its publish and before its ack; another router then takes its
shards over (a new consumer under a higher fencing token) and routes the pending entries
before any new one. Viewers join at any time, leave, and come back with their last event id
as the browser's EventSource does; the gateway's viewer queue is sometimes two events deep,
so a viewer also falls behind and catches up. Then the task ends the job (`answer`
completed, `done`), more of the same happens, the routers settle everything, and every
viewer, a late joiner too, reads to the end.

Each viewer then holds, as the reference frontend rebuilds it (`token` appends,
`token_recovery` replaces), exactly the text of the task's final attempt; it got `done`
once, last, and never an event id at or below one it had already got.

The job state lives in a `Backend`: here the in-memory store; `chat_answers` and `play` let
tests/integration/test_chat_properties_redis.py run the same property on the Redis store.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.application.errors import BroadcastFailed
from eco_router.application.port_values import Delivery, EncodedEvent
from eco_router.application.ports import FrameWriter, StateStore
from eco_router.application.route_batch import RouteBatch
from eco_router.application.stopping import cancel_and_wait
from eco_router.application.stream_job_events import JobStream
from eco_router.domain.event import FIRST_TOKEN_SEQ, JobEvent
from eco_router.domain.sse import Frame as SseFrame
from eco_router.domain.verdict import in_judging_order
from tests.unit.factories import START_MS, make_event
from tests.unit.test_chat_streams import Frame, frames_of, last_event_id, text_seen
from tests.unit.test_stream_job_events import Gateway

JOB = "job-1"
# Far above what any example redelivers: a poison entry is another test's matter.
MAX_DELIVERIES = 1000
# Ending is immediate on the in-memory adapters: a stream still open this long never ends.
END_WITHIN_S = 2.0
MAX_VIEWERS = 4

T = TypeVar("T", bound=Callable[..., Any])


# --- what happens ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """The task writes its next token."""

    delta: str


@dataclass(frozen=True)
class Stage:
    """The task writes its next stage event between tokens."""


@dataclass(frozen=True)
class Again:
    """An entry already written is written again, `back` entries from the last (0: the last
    one, a producer's retry of its write)."""

    back: int


@dataclass(frozen=True)
class Retry:
    """The task is retried: the next attempt writes `answer` started again, then its first
    token, from seq 1001."""

    delta: str


@dataclass(frozen=True)
class Late:
    """After the job's end, the task writes one more token (a retry racing the end, a buggy
    worker), `retried`: as the first token of a new attempt. The end ends the text: no
    viewer gets it."""

    delta: str
    retried: bool = False


class Death(enum.Enum):
    """Where a router dies in a batch; nothing it read is acked."""

    AFTER_READ = "after its read"
    AFTER_APPLY = "after its apply, before its publish"
    MID_PUBLISH = "part-way through its publish"
    AFTER_PUBLISH = "after its publish, before its ack"


@dataclass(frozen=True)
class Route:
    """A router routes up to `count` new entries (or every pending one, on taking over),
    or dies at `death` (`published` of the batch's events get out in a MID_PUBLISH)."""

    count: int
    death: Death | None = None
    published: int = 0


@dataclass(frozen=True)
class Join:
    """A new viewer opens the job's stream: at once, or in the background (`racing` what
    comes next); `direct`: its connection takes live events straight from the fan-out, as
    the HTTP server's does, else they all go through the stream."""

    racing: bool = False
    direct: bool = True


@dataclass(frozen=True)
class Leave:
    """A viewer's connection drops."""

    viewer: int


@dataclass(frozen=True)
class Return:
    """A viewer reconnects with the last event id it got, at once or `racing`."""

    viewer: int
    racing: bool = False


@dataclass(frozen=True)
class Run:
    """The viewers' streams run for a few turns of the event loop."""

    turns: int


Step = Write | Stage | Again | Retry | Late | Route | Join | Leave | Return | Run


# Hangul, an emoji sequence, JSON's special characters, a newline: what a frame must carry.
deltas = st.text(alphabet='ab 안녕👩‍💻"\\\n', min_size=1, max_size=3)
routes = st.builds(
    Route,
    count=st.integers(1, 12),
    death=st.one_of(st.none(), st.sampled_from(Death)),
    published=st.integers(0, 3),
)
viewer_steps = st.one_of(
    st.builds(Join, st.booleans(), st.booleans()),
    st.builds(Leave, st.integers(0, MAX_VIEWERS - 1)),
    st.builds(Return, st.integers(0, MAX_VIEWERS - 1), st.booleans()),
    st.builds(Run, st.integers(1, 4)),
)
# Writes and routes weigh more: a router's death then falls on a batch with tokens in it.
answer_steps = st.lists(
    st.one_of(
        *[st.builds(Write, deltas)] * 3,
        st.builds(Stage),
        st.builds(Again, st.integers(0, 6)),
        st.builds(Retry, deltas),
        *[routes] * 3,
        viewer_steps,
    ),
    min_size=4,
    max_size=40,
)
# A viewer that keeps up, and one whose queue overflows unless it reads between batches.
queue_sizes = st.sampled_from([256, 256, 2])
# After the end its entries may come again, and a late token may come after it.
end_steps = st.lists(
    st.one_of(
        st.builds(Again, st.integers(0, 6)),
        st.builds(Late, deltas, st.booleans()),
        routes,
        viewer_steps,
    ),
    max_size=12,
)


# --- the task, the routers, the viewers -----------------------------------------------------


class Task:
    """The chat worker: the entries it wrote, and the text of each of its attempts."""

    def __init__(self, gw: Gateway) -> None:
        self._gw = gw
        self.attempt = 0
        self.texts = [""]
        self.written: list[dict[str, str]] = []
        self._token_seq = FIRST_TOKEN_SEQ
        self._stage_seq = 160

    def write(self, seq: int, **fields: str) -> None:
        self.written.append({"seq": str(seq), **fields})
        self._gw.h.xadd(JOB, seq, **fields)

    def start(self) -> None:
        self.write(0, stage="queued", status="started")
        self.write(160, stage="answer", status="started")

    def token(self, delta: str) -> None:
        fields = {"stage": "token", "status": "streaming", "content": delta, "node": "answer"}
        if self.attempt:
            fields["attempt"] = str(self.attempt)
        self.write(self._token_seq, **fields)
        self._token_seq += 1
        self.texts[-1] += delta

    def stage(self) -> None:
        # Stage seqs between `answer` started (160) and its completion (180).
        if self._stage_seq < 179:
            self._stage_seq += 1
            self.write(self._stage_seq, stage="answer", status="running")

    def again(self, back: int) -> None:
        entry = self.written[-1 - back % len(self.written)]
        self._gw.h.xadd(JOB, **entry)

    def retried(self, delta: str) -> None:
        self.attempt += 1
        self.texts.append("")
        self._token_seq = FIRST_TOKEN_SEQ
        self.write(160, stage="answer", status="started")
        self.token(delta)

    def late(self, delta: str, *, retried: bool) -> None:
        """A token after the end: not in any attempt's text, as none may show it."""
        fields = {"stage": "token", "status": "streaming", "content": delta, "node": "answer"}
        attempt = self.attempt + 1 if retried else self.attempt
        if attempt:
            fields["attempt"] = str(attempt)
        self.write(FIRST_TOKEN_SEQ if retried else self._token_seq, **fields)
        if not retried:
            self._token_seq += 1

    def end(self) -> None:
        self.write(180, stage="answer", status="completed")
        self.write(181, stage="done", status="completed", result='{"ok": true}')


class Backend(Protocol):
    """Where an example's routers keep job state, made in the example's event loop."""

    def store(self) -> StateStore | None:
        """The state store of the harness's family and group (None: the gateway's in-memory
        one)."""

    async def took_over(self, fence: Mapping[str, int]) -> None:
        """A router took the shards over under `fence`'s tokens: write them where the store
        checks its fence, as the lease store does."""


class InMemoryBackend(Backend):
    """The in-memory store, which checks its fence on the streams' lease table."""

    def store(self) -> StateStore | None:
        return None

    async def took_over(self, fence: Mapping[str, int]) -> None:
        pass


class Routers:
    """The router that holds every shard; when it dies, the next one takes them over under
    a higher fencing token and routes what its predecessor left pending first."""

    def __init__(self, gw: Gateway, backend: Backend) -> None:
        self._gw = gw
        self._backend = backend
        self._generation = 0

    async def take_over(self) -> None:
        h = self._gw.h
        self._generation += 1
        self._source: InMemoryEventSource = h.consumer_source(f"router-{self._generation}")
        self._fence = {stream: self._generation for stream in h.family.streams}
        h.leases.epochs.update(self._fence)
        await self._backend.took_over(self._fence)
        self._route: RouteBatch = h.route_batch(self._source)
        self._owed_take_over = True

    async def _deliveries(self, count: int) -> list[Delivery]:
        if self._owed_take_over:
            self._owed_take_over = False
            claimed: list[Delivery] = []
            for stream, token in self._fence.items():
                page = await self._source.claim(
                    stream, token=token, cursor="0-0", min_idle_ms=0, count=1000
                )
                claimed += page.deliveries
            if claimed:
                return claimed
        return (await self._source.read_new(self._gw.h.read_from, count=count)).deliveries

    async def route(self, step: Route) -> int:
        """Route one batch as `step` says; how many entries it held."""
        deliveries = await self._deliveries(step.count)
        if step.death is None:
            await self._route(deliveries, self._fence)
            return len(deliveries)
        if step.death is not Death.AFTER_READ:
            with self._dying_at(step):
                await self._route(deliveries, self._fence, ack=False)
        await self.take_over()
        return len(deliveries)

    @contextlib.contextmanager
    def _dying_at(self, step: Route) -> Iterator[None]:
        broadcaster = self._gw.h.broadcaster
        real_broadcast = broadcaster.broadcast
        assert step.death is not None
        death = step.death

        async def broadcast(events: Sequence[EncodedEvent]) -> None:
            if death is Death.AFTER_PUBLISH:
                await real_broadcast(events)
                return
            if death is Death.MID_PUBLISH:
                await real_broadcast(events[: step.published])
            raise BroadcastFailed(f"the router died {death.value}")

        broadcaster.broadcast = broadcast  # type: ignore[method-assign]
        try:
            yield
        finally:
            broadcaster.broadcast = real_broadcast  # type: ignore[method-assign]

    async def settle(self) -> None:
        """Route until nothing is pending or unread."""
        while await self.route(Route(count=100)):
            pass
        assert not self._gw.h.pending()


class Connection(FrameWriter):
    """A viewer's connection as the HTTP server hands it to the stream: what is written to
    it goes out in order with the stream's own chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    def writable(self) -> bool:
        return True

    async def drained(self) -> None:
        pass

    def write(self, frame: SseFrame) -> None:
        self._chunks.append(frame.encoded)

    def write_all(self, frames: Sequence[SseFrame]) -> None:
        self._chunks.append(b"".join(frame.encoded for frame in frames))

    def keep_alive(self, every_s: float) -> None:
        pass

    def stop_keepalive(self) -> None:
        pass


@dataclass
class Browser:
    """One viewer across its connections: every chunk it got, and its open connection
    (`direct`: one that always takes writes, so live events go straight to it; else one that
    takes a chunk at a time, as its reader reads them)."""

    gw: Gateway
    direct: bool = True
    chunks: list[bytes] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    # An open stream whose reader may be cancelled before it ever runs: closed on leaving.
    stream: JobStream | None = None

    def frames(self) -> list[Frame]:
        return frames_of(self.chunks)

    @property
    def connected(self) -> bool:
        return self.reader is not None and not self.reader.done()

    async def connect(self, *, racing: bool = False) -> None:
        """Open a stream from the last event id got; `racing`: the stream subscribes and
        reads its replay once the event loop gets to it, else before this returns."""
        last_id = last_event_id(self.frames())
        if racing:
            self.reader = asyncio.create_task(self._open_and_read(last_id))
            return
        stream = await self._open(last_id)
        self.reader = asyncio.create_task(self._read(stream))

    async def _open(self, last_id: int | None) -> JobStream:
        self.stream = await self.gw.stream.open("scan", JOB, last_id)
        return self.stream

    async def _open_and_read(self, last_id: int | None) -> None:
        await self._read(await self._open(last_id))

    async def _read(self, stream: JobStream) -> None:
        try:
            if self.direct:
                await stream.run(Connection(self.chunks))
            else:
                async for chunk in stream:
                    self.chunks.append(chunk)
        finally:
            await stream.aclose()

    async def leave(self) -> None:
        if self.reader is not None:
            # Cancelled again until it ends: a cancel that lands as a Redis call's reply
            # arrives may be dropped (see `cancel_and_wait`).
            await cancel_and_wait([self.reader])
            self.reader = None
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def to_the_end(self) -> None:
        """Read until the stream ends on its own; reconnect (as EventSource does) while it
        ends without `done`."""
        for _ in range(3):
            if self.reader is None:
                await self.connect()
            assert self.reader is not None
            done, _ = await asyncio.wait({self.reader}, timeout=END_WITHIN_S)
            assert done, f"the stream did not end: {self.frames()}"
            self.reader = self.stream = None
            if any(f.event == "done" for f in self.frames()):
                return


class Answer:
    """One example: the gateway, the task, the routers and the viewers."""

    def __init__(self, queue_size: int, backend: Backend) -> None:
        self.gw = Gateway(queue_size=queue_size, store=backend.store())
        self.gw.h.max_deliveries = MAX_DELIVERIES
        self.task = Task(self.gw)
        self.routers = Routers(self.gw, backend)
        self.browsers: list[Browser] = []

    async def do(self, step: Step) -> None:
        match step:
            case Write(delta):
                self.task.token(delta)
            case Stage():
                self.task.stage()
            case Again(back):
                self.task.again(back)
            case Retry(delta):
                self.task.retried(delta)
            case Late(delta, retried):
                self.task.late(delta, retried=retried)
            case Route():
                await self.routers.route(step)
            case Join(racing, direct) if len(self.browsers) < MAX_VIEWERS:
                self.browsers.append(Browser(self.gw, direct))
                await self.browsers[-1].connect(racing=racing)
            case Leave(n) if n < len(self.browsers):
                await self.browsers[n].leave()
            case Return(n, racing) if n < len(self.browsers) and not self.browsers[n].connected:
                await self.browsers[n].connect(racing=racing)
            case Run(turns):
                for _ in range(turns):
                    await asyncio.sleep(0)

    async def play(
        self, answer: Sequence[Step], after_the_end: Sequence[Step], *, direct: bool = True
    ) -> None:
        """`direct`: whether the viewer from the start takes live events straight from the
        fan-out (the late joiner is the other kind)."""
        await self.routers.take_over()
        await self.gw.h.source.prepare()
        await self.do(Join(direct=direct))  # a viewer from the start
        self.task.start()
        for step in answer:
            await self.do(step)
        self.task.end()
        for step in after_the_end:
            await self.do(step)
        await self.routers.settle()
        self.browsers.append(Browser(self.gw, direct=not direct))  # a late joiner
        try:
            for browser in self.browsers:
                await browser.to_the_end()
        finally:
            for browser in self.browsers:
                await browser.leave()


# --- the property ---------------------------------------------------------------------------

# A router dies after applying a token a viewer waits for; the next one is published.
DIED_AFTER_APPLY_WHILE_WATCHED: list[Step] = [
    Write("a"),
    Route(12),
    Run(2),
    Write("b"),
    Route(12, Death.AFTER_APPLY),
    Route(12),
    Run(2),
    Write("c"),
    Route(12),
    Run(2),
]


# The interleavings that matter most, run every time whatever hypothesis draws: tokens a
# router applied and died before publishing; a retried task while a viewer watches (through
# the stream, and written straight to its connection); an entry written again after the end;
# an older attempt's token written again after the end; tokens written after the end.
MUST_RUN: list[tuple[list[Step], list[Step], int, bool]] = [
    ([Write("a"), Route(12, Death.AFTER_APPLY), Write("b")], [], 256, False),
    ([Write("a"), Route(12, Death.MID_PUBLISH, 3), Write("b"), Route(12)], [], 256, False),
    (DIED_AFTER_APPLY_WHILE_WATCHED, [], 256, True),
    ([Write("a"), Route(12), Run(2), Retry("b"), Route(12), Run(2), Write("c")], [], 256, False),
    ([Write("a"), Route(12), Run(2), Retry("b"), Route(12), Run(2), Write("c")], [], 256, True),
    ([Write("a"), Write("b")], [Again(3)], 256, True),
    ([Write("old"), Retry("new")], [Again(4)], 256, True),
    ([Write("a"), Route(12)], [Late("!"), Route(12)], 256, True),
    ([Write("a")], [Late("b"), Late("c", retried=True), Again(0)], 256, False),
]


def chat_answers(max_examples: int) -> Callable[[T], T]:
    """The property's draws and `MUST_RUN`, for a test taking `answer`, `after_the_end`,
    `queue_size` and `direct` (and fixtures)."""

    def decorate(test: T) -> T:
        for answer, after_the_end, queue_size, direct in reversed(MUST_RUN):
            test = example(
                answer=answer, after_the_end=after_the_end, queue_size=queue_size, direct=direct
            )(test)
        test = given(
            answer=answer_steps,
            after_the_end=end_steps,
            queue_size=queue_sizes,
            direct=st.booleans(),
        )(test)
        return settings(
            max_examples=max_examples,
            deadline=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.function_scoped_fixture,
            ],
        )(test)

    return decorate


async def play(
    answer: Sequence[Step],
    after_the_end: Sequence[Step],
    *,
    queue_size: int,
    direct: bool,
    backend: Backend,
) -> Answer:
    """One example played out on `backend`'s store."""
    played = Answer(queue_size, backend)
    await played.play(answer, after_the_end, direct=direct)
    return played


def assert_every_viewer_got_the_final_text(played: Answer) -> None:
    final_text = played.task.texts[-1]
    for n, browser in enumerate(played.browsers):
        frames = browser.frames()
        ids = [f.id for f in frames if f.id is not None]
        assert text_seen(frames) == final_text, (n, frames)
        assert [f.event for f in frames].count("done") == 1, (n, frames)
        assert frames[-1].event == "done", (n, frames)
        assert all(a < b for a, b in itertools.pairwise(ids)), (n, ids)


@chat_answers(max_examples=250)
def test_every_viewer_ends_with_the_final_attempts_text_and_done_once(
    answer: list[Step], after_the_end: list[Step], queue_size: int, direct: bool
) -> None:
    played = asyncio.run(
        play(answer, after_the_end, queue_size=queue_size, direct=direct, backend=InMemoryBackend())
    )

    assert_every_viewer_got_the_final_text(played)


# --- what the property found ----------------------------------------------------------------


def token(seq: int, content: str, attempt: int = 0) -> JobEvent:
    return make_event(
        seq=seq,
        stage="token",
        status="streaming",
        extra={"content": content},
        attempt=attempt,
        stream_id=f"{START_MS}-{seq}",
    )


class TestJudgingOrderAroundTheEnd:
    def test_the_end_is_judged_after_every_token_written_before_it(self) -> None:
        new = token(1001, "new", attempt=1)
        done = make_event(seq=181, stage="done", status="completed")
        batch = [token(1001, "old "), new, done, token(1002, "late")]

        ordered = in_judging_order(batch)

        assert ordered.index(new) < ordered.index(done)

    async def test_an_older_attempts_late_token_after_the_end_leaves_the_final_text_whole(
        self,
    ) -> None:
        gw = Gateway()
        await gw.h.source.prepare()
        streaming = {"stage": "token", "status": "streaming"}
        gw.h.xadd(JOB, 1001, content="old ", **streaming)
        gw.h.xadd(JOB, 1001, content="new", attempt=1, **streaming)
        gw.h.xadd(JOB, 181, stage="done", status="completed")
        gw.h.xadd(JOB, 1002, content="late", **streaming)  # the first attempt's, late

        await gw.h.route(await gw.h.read())  # one batch

        frames = frames_of([chunk async for chunk in gw.stream("scan", JOB, None)])
        assert text_seen(frames) == "new"
        assert frames[-1].data["text_check"]["sha1"] == hashlib.sha1(b"new").hexdigest()

    async def test_a_token_written_again_after_the_end_leaves_the_text_whole(self) -> None:
        gw = Gateway()
        await gw.h.source.prepare()
        streaming = {"stage": "token", "status": "streaming"}
        gw.h.xadd(JOB, 1001, content="a", **streaming)
        gw.h.xadd(JOB, 1002, content="b", **streaming)
        gw.h.xadd(JOB, 181, stage="done", status="completed")
        gw.h.xadd(JOB, 1001, content="a", **streaming)  # a producer's retry, late

        await gw.h.route(await gw.h.read())  # one batch

        frames = frames_of([chunk async for chunk in gw.stream("scan", JOB, None)])
        assert text_seen(frames) == "ab"
        assert frames[-1].data["text_check"]["bytes"] == 2


class TestLiveEventsWrittenThrough:
    """A viewer whose connection takes live events straight from the fan-out, as the HTTP
    server's does, while its stream waits."""

    async def _watching(self, gw: Gateway) -> Browser:
        await gw.h.source.prepare()
        browser = Browser(gw, direct=True)
        await browser.connect()
        await asyncio.sleep(0)  # the stream waits for live events
        return browser

    async def _route(self, gw: Gateway, deliveries: list[Delivery] | None = None) -> None:
        await gw.h.route(await gw.h.read() if deliveries is None else deliveries)
        for _ in range(3):
            await asyncio.sleep(0)

    async def test_tokens_applied_and_never_published_reach_it_before_the_next(self) -> None:
        gw = Gateway()
        browser = await self._watching(gw)
        streaming = {"stage": "token", "status": "streaming"}
        gw.h.xadd(JOB, 1001, content="a", **streaming)
        await self._route(gw)
        gw.h.xadd(JOB, 1002, content="b", **streaming)
        gw.h.broadcaster.available = False  # the router dies between its apply and publish
        await self._route(gw)
        gw.h.broadcaster.available = True
        await self._route(gw, await gw.h.redeliver())  # judged a duplicate: not published
        gw.h.xadd(JOB, 1003, content="c", **streaming)
        await self._route(gw)
        gw.h.xadd(JOB, 181, stage="done", status="completed")
        await self._route(gw)

        await browser.to_the_end()
        assert text_seen(browser.frames()) == "abc"

    async def test_a_retried_attempts_first_token_replaces_the_text(self) -> None:
        gw = Gateway()
        browser = await self._watching(gw)
        streaming = {"stage": "token", "status": "streaming"}
        gw.h.xadd(JOB, 1001, content="old", **streaming)
        await self._route(gw)
        gw.h.xadd(JOB, 1001, content="new", attempt=1, **streaming)
        await self._route(gw)
        gw.h.xadd(JOB, 181, stage="done", status="completed")
        await self._route(gw)

        await browser.to_the_end()
        assert text_seen(browser.frames()) == "new"
