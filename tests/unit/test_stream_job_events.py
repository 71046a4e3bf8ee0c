"""StreamJobEvents on the in-memory adapters: replay, dedup, snapshots, the end, timers."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import orjson
import pytest

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.event_feed import InMemoryEventFeed
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.application.errors import TransientError
from eco_router.application.port_values import EncodedEvent, FeedGap
from eco_router.application.ports import EventFeed, FeedSubscription, FrameWriter, StateStore
from eco_router.application.stream_job_events import StreamJobEvents, StreamLimits
from eco_router.domain.event_size import DEFAULT_HISTORY_MAX_BYTES
from eco_router.domain.sse import KEEPALIVE_FRAME, Frame, GatewayEvent
from tests.unit.factories import GROUP, START_MS, Harness, eventually, make_event

DONE = {"stage": "done", "status": "done"}
FAILED = {"stage": "scan", "status": "failed"}


# --- wiring -------------------------------------------------------------------------------


# Beyond every test's span: only the tests of the quiet re-check see one.
QUIET_NEVER_RECHECKED_S = 100_000.0


class Gateway:
    """A harness whose store keeps `history_size` events, and the use case reading from it."""

    def __init__(
        self,
        *,
        history_size: int = 100,
        queue_size: int = 256,
        keepalive_s: float = 15.0,
        max_wait_s: float = 300.0,
        job_idle_s: float = 600.0,
        feed: EventFeed | None = None,
        history_max_bytes: int = DEFAULT_HISTORY_MAX_BYTES,
        largest_event_bytes: int | None = None,
        recheck_s: float = QUIET_NEVER_RECHECKED_S,
        store: StateStore | None = None,
    ) -> None:
        """`store`: where the router keeps job state (default: an in-memory store)."""
        self.h = Harness()
        self.h.store = store or InMemoryStateStore(
            clock=self.h.clock,
            streams=self.h.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=history_size,
            history_max_bytes=history_max_bytes,
        )
        self.h.route = self.h.route_for(self.h.source)
        self.decoder = OrjsonEventDecoder()
        self.metrics = InMemoryGatewayMetrics()
        self.feed = feed or InMemoryEventFeed(
            self.h.broadcaster, decoder=self.decoder, metrics=self.metrics, queue_size=queue_size
        )
        trimmed_above = (
            None if largest_event_bytes is None else history_max_bytes - largest_event_bytes
        )
        self.limits = StreamLimits(
            keepalive_s=keepalive_s,
            max_wait_s=max_wait_s,
            job_idle_s=job_idle_s,
            history_size=history_size,
            history_trimmed_above_bytes=trimmed_above,
            recheck_s=recheck_s,
        )
        self.stream = StreamJobEvents(
            feed=self.feed,
            store=self.h.store,
            decoder=self.decoder,
            clock=self.h.clock,
            metrics=self.metrics,
            limits=self.limits,
        )

    async def produce(self, job_id: str, *seqs: int, **fields: str) -> None:
        """Producers append these events and the router routes them (one batch)."""
        for seq in seqs:
            self.h.xadd(job_id, seq, **fields)
        await self.h.route(await self.h.read())

    def connect(self, job_id: str = "job-1", last_event_id: int | None = None) -> Viewer:
        return Viewer(self.stream("scan", job_id, last_event_id))

    async def connected(self, job_id: str = "job-1", last_event_id: int | None = None) -> Viewer:
        """A viewer that has had its replay and now waits for live events."""
        viewer = self.connect(job_id, last_event_id)
        await eventually(lambda: self.metrics.active == 1)
        return viewer


@pytest.fixture
async def gw() -> Gateway:
    gateway = Gateway()
    await gateway.h.source.prepare()
    return gateway


class Viewer:
    """Reads a stream in the background, as the HTTP response does."""

    def __init__(self, frames: AsyncIterator[bytes]) -> None:
        self.frames: list[bytes] = []
        self._task = asyncio.create_task(self._read(frames))

    async def _read(self, frames: AsyncIterator[bytes]) -> None:
        async for frame in frames:
            self.frames.append(frame)

    @property
    def seen(self) -> list[str]:
        return describe(self.frames)

    async def ended(self) -> list[str]:
        """The frames of a stream that must end on its own."""
        async with asyncio.timeout(5):
            await self._task
        return self.seen

    async def has_seen(self, count: int) -> list[str]:
        await eventually(lambda: len(self.seen) >= count)
        return self.seen

    async def disconnect(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def describe(frames: list[bytes]) -> list[str]:
    """Frames as short strings: `3:scan`, `snapshot:5`, `snapshot:null`, `keepalive`, `error:x`."""
    # A chunk may hold several frames (the replay, or live events already waiting).
    return [
        _describe(frame + b"\n\n")
        for chunk in frames
        for frame in chunk.removesuffix(b"\n\n").split(b"\n\n")
    ]


def _describe(frame: bytes) -> str:
    if frame == KEEPALIVE_FRAME:
        return "keepalive"
    assert frame.endswith(b"\n\n"), frame
    lines = frame.decode().removesuffix("\n\n").split("\n")
    fields = dict(line.split(": ", 1) for line in lines)
    data = orjson.loads(fields["data"])
    if "id" in fields:
        assert data.get("event_id", data.get("seq")) == int(fields["id"]), frame
        return f"{fields['id']}:{fields['event']}"
    if fields["event"] == "snapshot":
        assert set(data) == {"job_id", "state"}, frame  # one shape, known job or not
        if data["state"] is None:
            return "snapshot:null"
        return f"snapshot:{data['state']['seq']}"
    return f"{fields['event']}:{data['error']}"


# --- a feed on simulated time ---------------------------------------------------------------


# What happens meanwhile at a scripted time (the router routes, the store goes away).
Action = Callable[[], Awaitable[None]]
Step = GatewayEvent | FeedGap | Action


class ScriptedSubscription(FeedSubscription):
    """Hands out scripted items at scripted monotonic times, and runs scripted actions at
    theirs; waiting moves the ManualClock."""

    def __init__(self, clock: ManualClock, script: Sequence[tuple[float, Step]]):
        self._clock = clock
        self._script = deque(sorted(script, key=lambda step: step[0]))
        self.waits = 0
        self.closed = False

    async def next(self, timeout_s: float) -> GatewayEvent | FeedGap | None:
        self.waits += 1
        if self.waits > 10_000:
            raise AssertionError("the stream never ended")
        assert timeout_s > 0, "waiting for nothing would spin"
        now = self._clock.monotonic()
        while self._script and self._script[0][0] <= now + timeout_s:
            at, item = self._script.popleft()
            self._clock.advance(round(max(0.0, at - now) * 1000))
            if isinstance(item, GatewayEvent | FeedGap):
                return item
            await item()
            timeout_s -= at - now
            now = at
        self._clock.advance(round(timeout_s * 1000))
        return None

    async def close(self) -> None:
        self.closed = True


class ScriptedFeed(EventFeed):
    """One scripted subscription; `on_subscribe` runs once subscribed (events racing the replay)."""

    def __init__(
        self,
        clock: ManualClock,
        script: Sequence[tuple[float, Step]] | None = None,
        on_subscribe: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.subscription = ScriptedSubscription(clock, script or [])
        self.subscribed: list[tuple[str, str]] = []
        self.on_subscribe = on_subscribe

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        self.subscribed.append((domain, job_id))
        if self.on_subscribe is not None:
            await self.on_subscribe()
        return self.subscription


def gateway_event(**overrides: Any) -> GatewayEvent:
    """A routed event of job-1 as the feed hands it out (a running `scan` unless overridden)."""
    values: dict[str, Any] = {"stage": "scan", "status": "running", **overrides}
    event = OrjsonEventDecoder().decode(orjson.dumps(make_event(**values).as_payload()))
    assert event is not None
    return event


async def scripted_gateway(
    script: Sequence[tuple[float, Step]] | None = None,
    *,
    keepalive_s: float,
    max_wait_s: float,
    job_idle_s: float = 600.0,
    history_size: int = 100,
    recheck_s: float = QUIET_NEVER_RECHECKED_S,
) -> tuple[Gateway, ScriptedFeed]:
    # The harness's clock is made first, so the feed can share it.
    gateway = Gateway(
        keepalive_s=keepalive_s,
        max_wait_s=max_wait_s,
        job_idle_s=job_idle_s,
        history_size=history_size,
        recheck_s=recheck_s,
    )
    feed = ScriptedFeed(gateway.h.clock, script)
    gateway.stream = StreamJobEvents(
        feed=feed,
        store=gateway.h.store,
        decoder=gateway.decoder,
        clock=gateway.h.clock,
        metrics=gateway.metrics,
        limits=gateway.limits,
    )
    await gateway.h.source.prepare()
    return gateway, feed


async def collect(frames: AsyncIterator[bytes]) -> list[str]:
    """Read a stream that ends without any real waiting (scripted feed)."""
    return describe([frame async for frame in frames])


# --- tests ----------------------------------------------------------------------------------


class TestReplay:
    async def test_a_new_client_gets_the_history_then_live_events(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1, 2)
        viewer = await gw.connected()

        await gw.produce("job-1", 3)
        await gw.produce("job-1", 4, **DONE)

        assert await viewer.ended() == ["1:scan", "2:scan", "3:scan", "4:done"]

    async def test_a_resuming_client_gets_exactly_the_later_events_in_seq_order(
        self, gw: Gateway
    ) -> None:
        gw.h.xadd("job-1", 5)
        gw.h.xadd("job-1", 2)
        gw.h.xadd("job-1", 4)
        gw.h.xadd("job-1", 1)
        gw.h.xadd("job-1", 3)
        await gw.h.route(await gw.h.read())
        viewer = await gw.connected(last_event_id=2)

        assert viewer.seen == ["3:scan", "4:scan", "5:scan"]
        await gw.produce("job-1", 6, **DONE)
        assert await viewer.ended() == ["3:scan", "4:scan", "5:scan", "6:done"]
        assert gw.metrics.snapshots == 0

    async def test_a_replayed_done_event_ends_the_stream(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1, 2)
        await gw.produce("job-1", 3, **DONE)

        assert await gw.connect(last_event_id=1).ended() == ["2:scan", "3:done"]
        assert gw.metrics.closed == Counter({"done": 1})

    async def test_a_client_reconnecting_with_the_done_id_gets_nothing_and_the_end(
        self, gw: Gateway
    ) -> None:
        await gw.produce("job-1", 1, 2)
        await gw.produce("job-1", 3, **DONE)

        assert await gw.connect(last_event_id=3).ended() == []
        assert gw.metrics.closed == Counter({"done": 1})
        assert gw.metrics.sent == Counter()

    async def test_a_client_reconnecting_with_the_failure_id_gets_nothing_and_the_end(
        self, gw: Gateway
    ) -> None:
        await gw.produce("job-1", 1)
        await gw.produce("job-1", 2, **FAILED)

        assert await gw.connect(last_event_id=2).ended() == []
        assert gw.metrics.closed == Counter({"failed": 1})

    async def test_an_event_routed_while_subscribing_is_replayed_and_sent_once(self) -> None:
        late = gateway_event(seq=2)
        gateway, feed = await scripted_gateway(
            [(1.0, late), (2.0, gateway_event(seq=3, **DONE))], keepalive_s=15, max_wait_s=60
        )
        await gateway.produce("job-1", 1)

        async def route_the_late_event() -> None:
            await gateway.produce("job-1", 2)

        feed.on_subscribe = route_the_late_event

        assert await collect(gateway.stream("scan", "job-1", None)) == [
            "1:scan",
            "2:scan",
            "3:done",
        ]
        assert feed.subscribed == [("scan", "job-1")]
        assert gateway.metrics.sent == Counter({"replay": 2, "live": 1})


class TestDedup:
    async def test_an_event_in_the_history_that_also_arrives_live_is_sent_once(
        self, gw: Gateway
    ) -> None:
        gw.h.broadcaster.available = False
        gw.h.xadd("job-1", 1)
        failed_publish = await gw.h.route(await gw.h.read())
        assert await gw.h.history_seqs("job-1") == [1]
        viewer = await gw.connected()
        assert viewer.seen == ["1:scan"]

        gw.h.broadcaster.available = True
        await gw.h.route(failed_publish.unsettled)  # the redelivery publishes seq 1 late
        await gw.produce("job-1", 2, **DONE)

        assert await viewer.ended() == ["1:scan", "2:done"]
        assert gw.h.published_seqs("job-1") == [1, 2]
        assert gw.metrics.sent == Counter({"replay": 1, "live": 1})
        assert gw.metrics.overtaken == 0

    async def test_a_live_event_at_or_below_the_last_sent_seq_is_not_sent(
        self, gw: Gateway
    ) -> None:
        await gw.produce("job-1", 1, 2, 3)
        viewer = await gw.connected(last_event_id=1)
        assert viewer.seen == ["2:scan", "3:scan"]

        stale = [make_event(seq=seq, stream_id=f"{1_700_000_000_000 + seq}-0") for seq in (1, 3)]
        await gw.h.broadcaster.broadcast(
            [EncodedEvent(event, gw.h.encoder.encode(event)) for event in stale]
        )
        await gw.produce("job-1", 4, **DONE)

        assert await viewer.ended() == ["2:scan", "3:scan", "4:done"]
        assert gw.h.published_seqs("job-1")[-3:] == [1, 3, 4]
        assert gw.metrics.overtaken == 0  # 1 is before the resume point, 3 was sent

    async def test_an_older_seq_published_after_a_newer_one_is_counted_as_overtaken(
        self, gw: Gateway
    ) -> None:
        viewer = await gw.connected()
        late = [make_event(seq=seq, stream_id=f"{1_700_000_000_000 + seq}-0") for seq in (3, 2)]

        await gw.h.broadcaster.broadcast(
            [EncodedEvent(event, gw.h.encoder.encode(event)) for event in late]
        )
        await gw.produce("job-1", 4, **DONE)

        assert await viewer.ended() == ["snapshot:null", "3:progress", "4:done"]
        assert gw.metrics.overtaken == 1

    async def test_a_live_event_of_the_same_job_in_another_domain_is_not_sent(
        self, gw: Gateway
    ) -> None:
        viewer = await gw.connected()
        other = make_event(domain="chat", seq=1)
        await gw.h.broadcaster.broadcast([EncodedEvent(other, gw.h.encoder.encode(other))])
        await gw.produce("job-1", 1, **DONE)

        assert await viewer.ended() == ["snapshot:null", "1:done"]


class TestSnapshots:
    async def test_an_unknown_job_gets_a_null_snapshot_then_live_events(self, gw: Gateway) -> None:
        viewer = await gw.connected("job-9")
        assert viewer.seen == ["snapshot:null"]
        assert viewer.frames[0] == b'event: snapshot\ndata: {"job_id":"job-9","state":null}\n\n'

        await gw.produce("job-9", 1)
        await gw.produce("job-9", 2, **DONE)

        assert await viewer.ended() == ["snapshot:null", "1:scan", "2:done"]
        assert gw.metrics.snapshots == 1

    async def test_a_last_event_id_older_than_the_history_gets_a_snapshot_first(self) -> None:
        gw = Gateway(history_size=3)
        await gw.h.source.prepare()
        await gw.produce("job-1", 1, 2, 3, 4, 5, 6)
        assert await gw.h.history_seqs("job-1") == [4, 5, 6]

        viewer = await gw.connected(last_event_id=1)
        await gw.produce("job-1", 7, **DONE)

        assert await viewer.ended() == ["snapshot:6", "4:scan", "5:scan", "6:scan", "7:done"]
        assert gw.metrics.snapshots == 1

    async def test_a_last_event_id_older_than_a_history_trimmed_by_bytes_gets_a_snapshot(
        self,
    ) -> None:
        # Two of these events fill the byte cap, far fewer than the history's size.
        gw = Gateway(history_size=100, history_max_bytes=1200, largest_event_bytes=500)
        await gw.h.source.prepare()
        await gw.produce("job-1", 1, 2, 3, 4, 5, 6, note="x" * 300)
        assert await gw.h.history_seqs("job-1") == [5, 6]

        viewer = await gw.connected(last_event_id=1)
        await gw.produce("job-1", 7, **DONE)

        assert await viewer.ended() == ["snapshot:6", "5:scan", "6:scan", "7:done"]
        assert gw.metrics.snapshots == 1

    async def test_a_last_event_id_inside_a_full_history_gets_no_snapshot(self) -> None:
        gw = Gateway(history_size=3)
        await gw.h.source.prepare()
        await gw.produce("job-1", 1, 2, 3, 4, 5, 6)

        viewer = await gw.connected(last_event_id=4)
        await gw.produce("job-1", 7, **DONE)

        assert await viewer.ended() == ["5:scan", "6:scan", "7:done"]
        assert gw.metrics.snapshots == 0


class TestTheEnd:
    async def test_a_live_done_event_ends_the_stream(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1)
        viewer = await gw.connected()

        await gw.produce("job-1", 2, **DONE)

        assert await viewer.ended() == ["1:scan", "2:done"]
        assert gw.metrics.closed == Counter({"done": 1})
        assert gw.metrics.active == 0

    async def test_a_live_failed_event_is_sent_as_an_error_and_ends_the_stream(
        self, gw: Gateway
    ) -> None:
        await gw.produce("job-1", 1)
        viewer = await gw.connected()

        await gw.produce("job-1", 2, **FAILED)

        assert await viewer.ended() == ["1:scan", "2:error"]
        assert viewer.frames[-1].startswith(b"id: 2\nevent: error\n")
        assert gw.metrics.closed == Counter({"failed": 1})

    async def test_nothing_is_sent_after_the_terminal_event(self) -> None:
        gateway, feed = await scripted_gateway(
            [
                (1.0, gateway_event(seq=1)),
                (2.0, gateway_event(seq=2, **DONE)),
                (3.0, gateway_event(seq=3)),
            ],
            keepalive_s=15,
            max_wait_s=60,
        )

        frames = await collect(gateway.stream("scan", "job-1", None))

        assert frames == ["snapshot:null", "1:scan", "2:done"]
        assert feed.subscription.closed

    async def test_a_disconnecting_client_closes_its_subscription(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1)
        viewer = await gw.connected()

        await viewer.disconnect()
        await gw.produce("job-1", 2, **DONE)

        assert viewer.seen == ["1:scan"]
        assert gw.metrics.closed == Counter({"disconnect": 1})
        assert gw.metrics.active == 0


class TestShutdown:
    async def test_closing_the_feed_ends_an_open_stream_without_an_error(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1)
        viewer = await gw.connected()

        gw.feed.close_viewers()

        assert await viewer.ended() == ["1:scan"]
        assert gw.metrics.closed == Counter({"shutdown": 1})
        assert gw.metrics.active == 0

    async def test_a_client_connecting_after_the_close_gets_its_replay_then_the_end(
        self, gw: Gateway
    ) -> None:
        await gw.produce("job-1", 1, 2)
        gw.feed.close_viewers()

        assert await gw.connect(last_event_id=1).ended() == ["2:scan"]
        assert gw.metrics.closed == Counter({"shutdown": 1})


class TestEndedAlready:
    """Whether a resuming client already has the job's end, asked before any stream opens."""

    @pytest.mark.parametrize("last_event_id", [3, 4, 1_000])
    async def test_a_done_job_at_or_below_the_last_event_id_has_ended(
        self, gw: Gateway, last_event_id: int
    ) -> None:
        await gw.produce("job-1", 1, 2)
        await gw.produce("job-1", 3, **DONE)

        assert await gw.stream.already_ended("scan", "job-1", last_event_id) is True

    async def test_a_failed_job_at_the_last_event_id_has_ended(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1)
        await gw.produce("job-1", 2, **FAILED)

        assert await gw.stream.already_ended("scan", "job-1", 2) is True

    @pytest.mark.parametrize("last_event_id", [None, 0, 2])
    async def test_a_client_that_has_not_seen_the_end_has_not(
        self, gw: Gateway, last_event_id: int | None
    ) -> None:
        await gw.produce("job-1", 1, 2)
        await gw.produce("job-1", 3, **DONE)

        assert await gw.stream.already_ended("scan", "job-1", last_event_id) is False

    async def test_a_running_job_has_not_ended(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1, 2)

        assert await gw.stream.already_ended("scan", "job-1", 2) is False

    async def test_an_unknown_job_has_not_ended(self, gw: Gateway) -> None:
        assert await gw.stream.already_ended("scan", "job-1", 5) is False

    @pytest.mark.parametrize("last_event_id", [2, 3, 1_000])
    async def test_a_job_idle_at_or_below_the_last_event_id_has_ended(
        self, gw: Gateway, last_event_id: int
    ) -> None:
        await gw.produce("job-1", 1, 2)
        gw.h.clock.advance(600_000)

        assert await gw.stream.already_ended("scan", "job-1", last_event_id) is True

    async def test_a_client_that_misses_events_of_an_idle_job_has_not_ended(
        self, gw: Gateway
    ) -> None:
        await gw.produce("job-1", 1, 2)
        gw.h.clock.advance(600_000)

        assert await gw.stream.already_ended("scan", "job-1", 1) is False

    async def test_a_job_heard_of_within_the_idle_limit_has_not_ended(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1, 2)
        gw.h.clock.advance(599_999)

        assert await gw.stream.already_ended("scan", "job-1", 2) is False

    async def test_the_question_counts_no_connection(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1, **DONE)

        await gw.stream.already_ended("scan", "job-1", 1)

        assert gw.metrics.active == 0
        assert gw.metrics.closed == Counter()


class TestTimers:
    @pytest.mark.parametrize(
        ("keepalive_s", "max_wait_s"), [(15, 60), (15, 50), (10, 300), (20, 15), (1, 1)]
    )
    async def test_an_idle_stream_is_kept_alive_by_its_writer_then_gets_a_timeout_error(
        self, keepalive_s: int, max_wait_s: int
    ) -> None:
        gateway, feed = await scripted_gateway(keepalive_s=keepalive_s, max_wait_s=max_wait_s)
        await gateway.produce("job-1", 1)
        opened = await gateway.stream.open("scan", "job-1", 1)
        writer = RecordingWriter()

        await opened.run(writer)

        assert writer.seen == [("stream", "error:timeout")]
        assert writer.keepalive == keepalive_s
        assert writer.keepalive_stopped
        assert gateway.h.clock.monotonic() == max_wait_s
        assert feed.subscription.closed
        assert gateway.metrics.closed == Counter({"timeout": 1})

    async def test_the_timeout_error_frame_is_exact(self) -> None:
        gateway, _ = await scripted_gateway(keepalive_s=100, max_wait_s=30)

        frames = [frame async for frame in gateway.stream("scan", "job-1", None)]

        assert frames[-1] == b'event: error\ndata: {"error":"timeout"}\n\n'

    async def test_the_wait_limit_counts_from_the_connection_not_the_last_event(self) -> None:
        events = [(float(t), gateway_event(seq=t)) for t in range(5, 60, 5)]
        gateway, _ = await scripted_gateway(events, keepalive_s=100, max_wait_s=32)

        frames = await collect(gateway.stream("scan", "job-1", None))

        sent_in_time = [f"{t}:scan" for t in range(5, 32, 5)]
        assert frames == ["snapshot:null", *sent_in_time, "error:timeout"]
        assert gateway.h.clock.monotonic() == 32


class TestIdleJobs:
    """A job not heard of for `job_idle_s` without its end (lost in a failover, or abandoned)
    ends its viewers' streams with `error: idle`, and a resuming client that has its latest
    event is told to stop (`already_ended`)."""

    async def test_a_job_whose_end_never_comes_ends_its_stream_as_idle(self) -> None:
        gateway, feed = await scripted_gateway(keepalive_s=250, max_wait_s=3600, job_idle_s=600)
        await gateway.produce("job-1", 1)

        frames = await collect(gateway.stream("scan", "job-1", None))

        assert frames == ["1:scan", "error:idle"]
        assert gateway.h.clock.monotonic() == 600
        assert feed.subscription.closed
        assert gateway.metrics.closed == Counter({"idle": 1})

    async def test_the_idle_frame_is_exact(self) -> None:
        gateway, _ = await scripted_gateway(keepalive_s=1000, max_wait_s=3600, job_idle_s=60)
        await gateway.produce("job-1", 1)

        frames = [frame async for frame in gateway.stream("scan", "job-1", 1)]

        assert frames == [b'event: error\ndata: {"error":"idle"}\n\n']

    async def test_the_idle_limit_counts_from_the_latest_event_not_the_connection(self) -> None:
        gateway, _ = await scripted_gateway(keepalive_s=1000, max_wait_s=3600, job_idle_s=600)
        await gateway.produce("job-1", 1)
        gateway.h.clock.advance(400_000)

        frames = await collect(gateway.stream("scan", "job-1", None))

        assert frames == ["1:scan", "error:idle"]
        assert gateway.h.clock.monotonic() == 600

    async def test_a_live_event_puts_off_the_idle_end(self) -> None:
        script = [(100.0, gateway_event(seq=2)), (500.0, gateway_event(seq=3))]
        gateway, _ = await scripted_gateway(
            script, keepalive_s=1000, max_wait_s=3600, job_idle_s=600
        )
        await gateway.produce("job-1", 1)

        frames = await collect(gateway.stream("scan", "job-1", None))

        assert frames == ["1:scan", "2:scan", "3:scan", "error:idle"]
        assert gateway.h.clock.monotonic() == 1100

    async def test_an_event_routed_late_counts_from_its_arrival_not_its_write(self) -> None:
        # Written an hour before it is routed (a router that was down): the job is alive.
        written_long_ago = f"{START_MS - 3_600_000}-0"
        script = [(500.0, gateway_event(seq=2, stream_id=written_long_ago))]
        gateway, _ = await scripted_gateway(
            script, keepalive_s=1000, max_wait_s=3600, job_idle_s=600
        )
        await gateway.produce("job-1", 1)

        frames = await collect(gateway.stream("scan", "job-1", 1))

        assert frames == ["2:scan", "error:idle"]
        assert gateway.h.clock.monotonic() == 1100

    @pytest.mark.parametrize(
        ("last_event_id", "expected"),
        [(None, ["1:scan", "2:scan", "error:idle"]), (1, ["2:scan", "error:idle"])],
    )
    async def test_a_job_idle_already_is_replayed_then_ended_without_waiting(
        self, last_event_id: int | None, expected: list[str]
    ) -> None:
        gateway, feed = await scripted_gateway(keepalive_s=15, max_wait_s=300, job_idle_s=600)
        await gateway.produce("job-1", 1, 2)
        gateway.h.clock.advance(600_000)

        frames = await collect(gateway.stream("scan", "job-1", last_event_id))

        assert frames == expected
        assert feed.subscription.waits == 0
        assert gateway.metrics.closed == Counter({"idle": 1})

    async def test_a_viewer_that_saw_an_end_the_store_lost_is_ended_once_the_job_is_idle(
        self,
    ) -> None:
        # The viewer got `done` (seq 3), published before a failover lost its write: the
        # store's state stays at seq 2, and no end will come.
        gateway, _ = await scripted_gateway(keepalive_s=1000, max_wait_s=3600, job_idle_s=600)
        await gateway.produce("job-1", 1, 2)
        gateway.h.clock.advance(100_000)
        assert await gateway.stream.already_ended("scan", "job-1", 3) is False

        frames = await collect(gateway.stream("scan", "job-1", 3))

        assert frames == ["error:idle"]
        assert gateway.h.clock.monotonic() == 600
        assert await gateway.stream.already_ended("scan", "job-1", 3) is True

    async def test_an_unknown_job_counts_from_the_connection(self) -> None:
        gateway, _ = await scripted_gateway(keepalive_s=1000, max_wait_s=3600, job_idle_s=600)
        gateway.h.clock.advance(5_000_000)

        frames = await collect(gateway.stream("scan", "job-1", 7))

        assert frames == ["snapshot:null", "error:idle"]
        assert gateway.h.clock.monotonic() == 5000 + 600

    async def test_the_wait_limit_still_ends_a_stream_first_when_shorter(self) -> None:
        gateway, _ = await scripted_gateway(keepalive_s=1000, max_wait_s=300, job_idle_s=600)
        await gateway.produce("job-1", 1)

        frames = await collect(gateway.stream("scan", "job-1", 1))

        assert frames == ["error:timeout"]
        assert gateway.h.clock.monotonic() == 300

    async def test_the_idle_end_rides_on_the_streams_one_wait(self) -> None:
        # No timer of its own: a quiet stream whose keepalives its connection keeps waits
        # once, until the idle limit.
        gateway, feed = await scripted_gateway(keepalive_s=15, max_wait_s=3600, job_idle_s=600)
        await gateway.produce("job-1", 1)
        opened = await gateway.stream.open("scan", "job-1", 1)
        writer = RecordingWriter()

        await opened.run(writer)

        assert writer.seen == [("stream", "error:idle")]
        assert feed.subscription.waits == 1
        assert gateway.h.clock.monotonic() == 600

    async def test_events_written_through_to_the_connection_put_off_the_idle_end(self) -> None:
        # Real waits of at most 0.2 s; the clock that decides is the manual one.
        gateway = Gateway(max_wait_s=60, job_idle_s=0.2)
        await gateway.h.source.prepare()
        opened = await gateway.stream.open("scan", "job-1")
        writer = RecordingWriter()
        run = asyncio.create_task(opened.run(writer))
        await eventually(lambda: writer.seen == [("stream", "snapshot:null")])

        gateway.h.clock.advance(150)
        await gateway.produce("job-1", 1)
        await eventually(lambda: len(writer.seen) == 2)
        gateway.h.clock.advance(150)  # idle since the connection, not since the event
        await asyncio.sleep(0.3)
        assert len(writer.seen) == 2
        gateway.h.clock.advance(100)

        async with asyncio.timeout(5):
            await run
        assert writer.seen == [
            ("stream", "snapshot:null"),
            ("live", "1:scan"),
            ("stream", "error:idle"),
        ]
        assert gateway.metrics.closed == Counter({"idle": 1})


class TestSlowClients:
    async def test_an_overflow_the_history_covers_leads_to_the_missing_events_without_a_snapshot(
        self,
    ) -> None:
        gw = Gateway(queue_size=2)
        await gw.h.source.prepare()
        await gw.produce("job-1", 1)
        viewer = await gw.connected()
        assert viewer.seen == ["1:scan"]

        # One batch: all five reach the viewer before its reader takes any.
        for seq in (2, 3, 4, 5):
            gw.h.xadd("job-1", seq)
        gw.h.xadd("job-1", 6, **DONE)
        await gw.h.route(await gw.h.read())

        assert await viewer.ended() == [
            "1:scan",
            "2:scan",
            "3:scan",
            "4:scan",
            "5:scan",
            "6:done",
        ]
        # 2 goes straight to the connection, whose reader has not taken it yet; of 3, 4, 5
        # and done, queued behind it, the oldest two are dropped.
        assert gw.metrics.dropped == 2
        assert gw.metrics.snapshots == 0
        assert gw.metrics.sent == Counter({"replay": 5, "live": 1})
        assert gw.metrics.closed == Counter({"done": 1})

    async def test_a_feed_gap_the_history_covers_sends_the_missed_events_and_no_snapshot(
        self,
    ) -> None:
        async def routed_while_the_feed_was_down() -> None:
            await gateway.produce("job-1", 3)
            await gateway.produce("job-1", 4, **DONE)

        gateway, _ = await scripted_gateway(
            [
                (0.5, routed_while_the_feed_was_down),
                (1.0, FeedGap("reconnect")),
                (2.0, gateway_event(seq=4, **DONE)),
            ],
            keepalive_s=15,
            max_wait_s=60,
        )
        await gateway.produce("job-1", 1, 2)

        frames = await collect(gateway.stream("scan", "job-1", None))

        assert frames == ["1:scan", "2:scan", "3:scan", "4:done"]
        assert gateway.metrics.snapshots == 0
        assert gateway.metrics.sent == Counter({"replay": 4})

    async def test_a_feed_gap_the_history_no_longer_covers_sends_a_snapshot_first(
        self,
    ) -> None:
        async def routed_while_the_feed_was_down() -> None:
            # 3 and 4 are trimmed from the history before the gap.
            await gateway.produce("job-1", 3, 4, 5, 6)
            await gateway.produce("job-1", 9, **DONE)

        gateway, _ = await scripted_gateway(
            [
                (0.5, routed_while_the_feed_was_down),
                (1.0, FeedGap("reconnect")),
                (2.0, gateway_event(seq=9, **DONE)),
            ],
            keepalive_s=15,
            max_wait_s=60,
            history_size=3,
        )
        await gateway.produce("job-1", 1, 2)

        assert await collect(gateway.stream("scan", "job-1", None)) == [
            "1:scan",
            "2:scan",
            "snapshot:9",
            "5:scan",
            "6:scan",
            "9:done",
        ]
        assert gateway.metrics.snapshots == 1


class TestMetrics:
    async def test_sent_events_are_counted_as_replayed_or_live(self, gw: Gateway) -> None:
        await gw.produce("job-1", 1, 2, 3)
        viewer = await gw.connected(last_event_id=1)

        await gw.produce("job-1", 4)
        await gw.produce("job-1", 5, **DONE)
        await viewer.ended()

        assert gw.metrics.sent == Counter({"replay": 2, "live": 2})

    async def test_live_latency_is_measured_from_the_entry_id(self, gw: Gateway) -> None:
        viewer = await gw.connected()
        gw.h.xadd("job-1", 1, **DONE)
        gw.h.clock.advance(40)
        await gw.h.route(await gw.h.read())

        await viewer.ended()

        assert gw.metrics.latencies_ms == [40.0]

    async def test_connections_are_counted_open_and_closed_with_their_reason(self) -> None:
        gateway, _ = await scripted_gateway(keepalive_s=10, max_wait_s=10)
        await gateway.produce("job-1", 1)
        await gateway.produce("job-2", 1, **DONE)
        await gateway.produce("job-3", 1, **FAILED)

        await collect(gateway.stream("scan", "job-1", None))
        await collect(gateway.stream("scan", "job-2", None))
        await collect(gateway.stream("scan", "job-3", None))

        assert gateway.metrics.closed == Counter({"timeout": 1, "done": 1, "failed": 1})
        assert gateway.metrics.active == 0

    async def test_an_open_stream_is_counted_active_until_it_ends(self, gw: Gateway) -> None:
        first = await gw.connected("job-1")
        second = gw.connect("job-2")
        await eventually(lambda: gw.metrics.active == 2)

        await first.disconnect()
        assert gw.metrics.active == 1
        await gw.produce("job-2", 1, **DONE)
        await second.ended()

        assert gw.metrics.active == 0
        assert gw.metrics.closed == Counter({"disconnect": 1, "done": 1})


class UnreachableFeed(EventFeed):
    """A Pub/Sub server that cannot be reached."""

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        raise TransientError("Pub/Sub unreachable")

    def close_viewers(self) -> None:
        pass


class TestOutages:
    async def test_an_unreachable_feed_fails_the_opening_and_counts_no_connection(self) -> None:
        gateway = Gateway(feed=UnreachableFeed())

        with pytest.raises(TransientError):
            await gateway.stream.open("scan", "job-1")

        assert (gateway.metrics.active, gateway.metrics.closed) == (0, Counter())

    async def test_an_unreachable_store_fails_the_opening_and_leaves_no_subscription(
        self,
    ) -> None:
        gateway, feed = await scripted_gateway(keepalive_s=15, max_wait_s=60)
        gateway.h.store.available = False

        with pytest.raises(TransientError):
            await gateway.stream.open("scan", "job-1")

        assert feed.subscription.closed
        assert gateway.metrics.active == 0

    async def test_a_stream_closed_before_it_was_read_releases_its_subscription(self) -> None:
        gateway, feed = await scripted_gateway(keepalive_s=15, max_wait_s=60)

        stream = await gateway.stream.open("scan", "job-1")
        await stream.aclose()
        await stream.aclose()

        assert feed.subscription.closed
        assert (gateway.metrics.active, gateway.metrics.closed) == (0, Counter({"disconnect": 1}))

    async def test_a_store_lost_while_catching_up_ends_the_stream_with_reason_error(
        self,
    ) -> None:
        async def store_lost() -> None:
            gateway.h.store.available = False

        gateway, feed = await scripted_gateway(
            [(0.5, store_lost), (1.0, FeedGap("reconnect"))], keepalive_s=15, max_wait_s=60
        )
        await gateway.produce("job-1", 1)

        assert await collect(gateway.stream("scan", "job-1", None)) == ["1:scan"]
        assert feed.subscription.closed
        assert gateway.metrics.closed == Counter({"error": 1})


class RecordingWriter(FrameWriter):
    """A connection's writer that records what it was given, and how: `live` straight from
    the feed's fan-out (`write`), `stream` from the stream's task (`write_all`)."""

    def __init__(self, *, writable: bool = True) -> None:
        self.writes: list[tuple[str, bytes]] = []
        self._open = asyncio.Event()
        if writable:
            self._open.set()
        self.keepalive: float | None = None
        self.keepalive_stopped = False

    def open(self, writable: bool) -> None:
        if writable:
            self._open.set()
        else:
            self._open.clear()

    @property
    def seen(self) -> list[tuple[str, str]]:
        return [(how, frame) for how, chunk in self.writes for frame in describe([chunk])]

    def writable(self) -> bool:
        return self._open.is_set()

    async def drained(self) -> None:
        await self._open.wait()

    def write(self, frame: Frame) -> None:
        self.writes.append(("live", frame.encoded))

    def write_all(self, frames: Sequence[Frame]) -> None:
        self.writes.append(("stream", b"".join(frame.encoded for frame in frames)))

    def keep_alive(self, every_s: float) -> None:
        self.keepalive = every_s

    def stop_keepalive(self) -> None:
        self.keepalive_stopped = True


class TestOneFramePath:
    """Every frame goes through the connection's writer: live events straight from the feed's
    fan-out while the connection takes them, the rest from the stream's task."""

    async def test_live_events_go_straight_to_the_writer_and_the_end_from_the_stream(
        self, gw: Gateway
    ) -> None:
        opened = await gw.stream.open("scan", "job-1")
        writer = RecordingWriter()
        run = asyncio.create_task(opened.run(writer))
        await eventually(lambda: writer.seen == [("stream", "snapshot:null")])
        await gw.produce("job-1", 1, 2)
        await eventually(lambda: len(writer.seen) == 3)
        await gw.produce("job-1", 3, **DONE)
        async with asyncio.timeout(5):
            await run
        assert writer.seen == [
            ("stream", "snapshot:null"),
            ("live", "1:scan"),
            ("live", "2:scan"),
            ("stream", "3:done"),
        ]
        assert gw.metrics.sent == Counter({"live": 3})
        assert gw.metrics.closed == Counter({"done": 1})

    async def test_a_connection_that_cannot_take_writes_holds_the_events_until_drained(
        self, gw: Gateway
    ) -> None:
        opened = await gw.stream.open("scan", "job-1")
        writer = RecordingWriter()
        run = asyncio.create_task(opened.run(writer))
        await eventually(lambda: writer.seen == [("stream", "snapshot:null")])
        writer.open(False)
        await gw.produce("job-1", 1)
        await gw.produce("job-1", 2, **DONE)
        await asyncio.sleep(0.05)
        assert writer.seen == [("stream", "snapshot:null")]
        writer.open(True)
        async with asyncio.timeout(5):
            await run
        assert writer.seen == [
            ("stream", "snapshot:null"),
            ("stream", "1:scan"),
            ("stream", "2:done"),
        ]

    async def test_once_the_connection_is_full_the_next_events_follow_in_order(
        self, gw: Gateway
    ) -> None:
        opened = await gw.stream.open("scan", "job-1")
        writer = RecordingWriter()
        run = asyncio.create_task(opened.run(writer))
        await eventually(lambda: len(writer.seen) == 1)
        await gw.produce("job-1", 1)
        await eventually(lambda: len(writer.seen) == 2)
        writer.open(False)
        await gw.produce("job-1", 2, 3)
        await gw.produce("job-1", 4, **DONE)
        writer.open(True)
        async with asyncio.timeout(5):
            await run
        assert [frame for _, frame in writer.seen] == [
            "snapshot:null",
            "1:scan",
            "2:scan",
            "3:scan",
            "4:done",
        ]
        assert writer.seen[1] == ("live", "1:scan")


class TestOvertakenOnLongStreams:
    async def test_a_repeat_of_an_event_sent_long_ago_is_not_counted_as_overtaken(
        self, gw: Gateway
    ) -> None:
        viewer = await gw.connected()
        for first in range(1, 301, 50):
            await gw.produce("job-1", *range(first, first + 50))
            await viewer.has_seen(first + 50)
        repeat = make_event(seq=1, stream_id=f"{1_700_000_000_000 + 1}-0")

        await gw.h.broadcaster.broadcast([EncodedEvent(repeat, gw.h.encoder.encode(repeat))])
        await gw.produce("job-1", 301, **DONE)

        assert (await viewer.ended())[-1] == "301:done"
        assert gw.metrics.overtaken == 0
