"""One job's live events fanned out by the Pub/Sub adapter's viewers to every stream of
`StreamJobEvents`: what is the same for every viewer is done once per event, whatever their
number; per viewer only the order check and the write."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.gateway_metrics import InMemoryGatewayMetrics
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.adapters.redis.gateway.channel_viewers import ChannelViewers
from eco_router.application.ports import EventDecoder, FrameWriter
from eco_router.application.stream_job_events import JobStream, StreamJobEvents
from eco_router.domain.sse import Frame, GatewayEvent
from eco_router.testing.confirmed_feed import ConfirmedFeed
from tests.unit.factories import START_MS, eventually

CHANNEL = "events:job-1"


class CountingDecoder(EventDecoder):
    """The real decoder, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._decoder = OrjsonEventDecoder()

    def decode(self, payload: bytes) -> GatewayEvent | None:
        self.calls += 1
        return self._decoder.decode(payload)


class CallLog(InMemoryGatewayMetrics):
    """The in-memory metrics, keeping each report of live events as it was made."""

    def __init__(self) -> None:
        super().__init__()
        self.live_reports: list[int] = []

    def events_sent(self, count: int, *, replayed: bool) -> None:
        super().events_sent(count, replayed=replayed)
        if not replayed:
            self.live_reports.append(count)


class Connection(FrameWriter):
    """A connection that takes every frame, keeping each one given: live ones (`write`, from
    the feed's fan-out) apart from the stream's own (`write_all`)."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.own: list[Frame] = []

    def writable(self) -> bool:
        return True

    async def drained(self) -> None:
        return None

    def write(self, frame: Frame) -> None:
        self.frames.append(frame)

    def write_all(self, frames: Sequence[Frame]) -> None:
        self.own += frames

    def keep_alive(self, every_s: float) -> None:
        return None

    def stop_keepalive(self) -> None:
        return None


def published(event_id: int) -> bytes:
    return orjson.dumps(
        {
            "event_id": event_id,
            "prev_event_id": event_id - 1 if event_id > 1 else None,
            "job_id": "job-1",
            "domain": "scan",
            "stage": "scan",
            "status": "running",
            "stream_id": f"{START_MS - 40}-0",
        }
    )


class Fanout:
    def __init__(self) -> None:
        self.clock = ManualClock(START_MS)
        self.decoder = CountingDecoder()
        self.metrics = CallLog()
        self.feed = ConfirmedFeed(
            ChannelViewers(decoder=self.decoder, metrics=self.metrics, queue_size=8)
        )
        store = InMemoryStateStore(
            clock=self.clock,
            streams=InMemoryStreams(self.clock),
            group="routers",
            state_ttl_s=3600,
            markers_ttl_s=3600,
            history_size=100,
        )
        self.stream = StreamJobEvents(
            feed=self.feed,
            store=store,
            decoder=self.decoder,
            clock=self.clock,
            metrics=self.metrics,
        )
        self.connections: list[Connection] = []
        self._readers: list[asyncio.Task[None]] = []

    async def watch(self, viewers: int) -> None:
        """`viewers` streams of job-1, each waiting for live events on its connection."""
        for _ in range(viewers):
            opened = await self.stream.open("scan", "job-1")
            connection = Connection()
            self.connections.append(connection)
            self._readers.append(asyncio.create_task(_run(opened, connection)))
        await eventually(lambda: self.metrics.active == viewers)
        for _ in range(3):
            await asyncio.sleep(0)

    async def close(self) -> None:
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


async def _run(stream: JobStream, connection: Connection) -> None:
    try:
        await stream.run(connection)
    finally:
        await stream.aclose()


@pytest.fixture
async def fanout() -> AsyncIterator[Fanout]:
    made = Fanout()
    try:
        yield made
    finally:
        with contextlib.suppress(Exception):
            await made.close()


class TestOncePerEvent:
    @pytest.mark.parametrize("viewers", [1, 3, 50])
    async def test_a_frame_is_decoded_and_encoded_once_per_event_whatever_the_viewers(
        self, fanout: Fanout, viewers: int
    ) -> None:
        await fanout.watch(viewers)
        decoded_before = fanout.decoder.calls

        for event_id in (1, 2, 3):
            fanout.feed.viewers.deliver(CHANNEL, published(event_id))

        assert fanout.decoder.calls - decoded_before == 3
        for n in range(3):
            frames = {id(c.frames[n]) for c in fanout.connections}
            assert len(frames) == 1, "every viewer is written the same frame"
        assert fanout.connections[0].frames[0].encoded.startswith(b"id: 1\nevent: scan\n")

    async def test_live_events_are_counted_once_per_event_with_the_number_of_viewers(
        self, fanout: Fanout
    ) -> None:
        await fanout.watch(20)

        for event_id in (1, 2):
            fanout.feed.viewers.deliver(CHANNEL, published(event_id))

        assert fanout.metrics.live_reports == [20, 20]
        assert fanout.metrics.sent["live"] == 40
        # One delivery latency per event: every viewer was written in the same turn.
        assert fanout.metrics.latencies_ms == [40.0, 40.0]

    async def test_a_viewer_that_already_has_the_event_is_not_written_nor_counted(
        self, fanout: Fanout
    ) -> None:
        await fanout.watch(5)
        fanout.feed.viewers.deliver(CHANNEL, published(1))

        fanout.feed.viewers.deliver(CHANNEL, published(1))

        assert [len(c.frames) for c in fanout.connections] == [1] * 5
        assert fanout.metrics.live_reports == [5]
