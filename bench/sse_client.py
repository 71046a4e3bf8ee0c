"""The SSE benchmark's client: raw-socket SSE connections on one asyncio loop.

A *probe* connection decodes HTTP/1.1 chunks and SSE frames and records each live event's
latency; any other connection only counts frames (cheap, so that thousands of viewers of one
job do not make this process the bottleneck). Every connection tells whether its stream
ended cleanly (the terminating chunk, or an `event: error` frame before it) or was cut.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from typing import cast

import orjson

CONNECT_CONCURRENCY = 200
CONNECT_TIMEOUT_S = 60.0
END_OF_BODY = b"0\r\n\r\n"


class Tally:
    """What every connection received: latencies of live events, frames, ends, problems."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.events = 0
        self.frames = 0
        self.first_frame_at = 0.0
        self.last_frame_at = 0.0
        self.out_of_order = 0
        self.snapshots = 0
        self.clean_ends = 0
        self.cut = 0
        self.problems: Counter[str] = Counter()
        self.all_received = asyncio.Event()
        self._expected: int | None = None

    def expect(self, frames: int) -> None:
        """Set `all_received` once `frames` live frames arrived in all (probes: events)."""
        self._expected = frames
        self._check()

    def count_frames(self, frames: int) -> None:
        if frames:
            now = time.monotonic()
            if not self.first_frame_at:
                self.first_frame_at = now
            self.last_frame_at = now
            self.frames += frames
            self._check()

    def record(self, latency_ms: float) -> None:
        self.events += 1
        self.latencies_ms.append(latency_ms)

    def frames_per_s(self) -> float:
        span = self.last_frame_at - self.first_frame_at
        return self.frames / span if span > 0 else 0.0

    def _check(self) -> None:
        if self._expected is not None and self.frames >= self._expected:
            self.all_received.set()


class SseConnection(asyncio.Protocol):
    """One SSE stream over a raw socket."""

    def __init__(self, request: bytes, tally: Tally, *, probe: bool) -> None:
        self.established: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.last_seq = -1
        self.ended = False
        self.lost = False
        self._probe = probe
        self._request = request
        self._tally = tally
        self._raw = bytearray()
        self._body = bytearray()
        self._headers_done = False
        self._chunked = False
        self._chunk_left = 0
        self._need_crlf = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writable = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.transport = writable
        writable.write(self._request)

    def data_received(self, data: bytes) -> None:
        if self.established.done() and not self._probe:
            # Frames end with a blank line; chunk framing uses CRLF only.
            self._tally.count_frames(data.count(b"\n\n"))
            if data.endswith(END_OF_BODY) and (len(data) == 5 or data[-7:-5] == b"\r\n"):
                self.ended = True
            return
        received_ms = time.time() * 1000
        self._raw += data
        if not self._headers_done and not self._read_headers():
            return
        if self._chunked:
            self._decode_chunks()
        else:
            self._body += self._raw
            self._raw.clear()
        body = self._body
        while (end := body.find(b"\n\n")) >= 0:
            frame = bytes(body[:end])
            del body[: end + 2]
            self._frame(frame, received_ms)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.established.done():
            self.established.set_exception(ConnectionError(f"closed before a frame: {exc}"))
        elif self.transport is not None:  # close() forgets the transport: not us
            if self.ended:
                self._tally.clean_ends += 1
            else:
                self._tally.cut += 1

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def _read_headers(self) -> bool:
        end = self._raw.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self._raw[:end]).decode("latin-1").lower().split("\r\n")
        del self._raw[: end + 4]
        self._headers_done = True
        status = head[0].split(" ", 2)
        if len(status) < 2 or status[1] != "200":
            self._fail(f"HTTP {head[0]}")
            return False
        self._chunked = "transfer-encoding: chunked" in head
        return True

    def _decode_chunks(self) -> None:
        raw = self._raw
        while raw:
            if self._chunk_left:
                take = min(self._chunk_left, len(raw))
                self._body += raw[:take]
                del raw[:take]
                self._chunk_left -= take
                self._need_crlf = self._chunk_left == 0
            elif self._need_crlf:
                if len(raw) < 2:
                    return
                del raw[:2]
                self._need_crlf = False
            else:
                line_end = raw.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(bytes(raw[:line_end]).split(b";")[0], 16)
                del raw[: line_end + 2]
                if size == 0:
                    self.ended = True  # the gateway ended the stream; connection_lost follows
                    return
                self._chunk_left = size

    def _frame(self, frame: bytes, received_ms: float) -> None:
        name = event_id = data = None
        for line in frame.split(b"\n"):
            key, _, value = line.partition(b": ")
            if key == b"event":
                name = value
            elif key == b"id":
                event_id = value
            elif key == b"data":
                data = value
        if name == b"snapshot":
            self._tally.snapshots += 1
            if not self.established.done():
                self.established.set_result(None)
            return
        if event_id is None or data is None:
            if data is not None and name != b"error":
                self._tally.problems[f"frame {frame[:60]!r}"] += 1
            return  # a keepalive comment, or the error frame of a timeout
        seq = int(event_id)
        if seq <= self.last_seq:
            self._tally.out_of_order += 1
        self.last_seq = seq
        stream_id: str = orjson.loads(data)["stream_id"]
        self._tally.record(received_ms - int(stream_id.partition("-")[0]))
        self._tally.count_frames(1)

    def _fail(self, problem: str) -> None:
        if not self.established.done():
            self.established.set_exception(ConnectionError(problem))
        self.close()


async def open_connections(
    port: int, domain: str, job_ids: Sequence[str], tally: Tally, *, probes: int
) -> tuple[list[SseConnection], Counter[str]]:
    """One SSE connection per entry of `job_ids` (repeats allowed), `CONNECT_CONCURRENCY`
    opening at a time; the first `probes` decode every frame.

    Returns the established connections and the failures by reason (a failed one is closed).
    """
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    established: list[SseConnection] = []
    failures: Counter[str] = Counter()

    async def open_one(n: int, job_id: str) -> None:
        request = (
            f"GET /api/v1/{domain}/{job_id}/events HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        connection: SseConnection | None = None
        async with gate:
            try:
                _, connection = await loop.create_connection(
                    lambda: SseConnection(request, tally, probe=n < probes), "127.0.0.1", port
                )
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await connection.established
            except (OSError, TimeoutError) as error:
                failures[f"{type(error).__name__}: {error}".rstrip(": ")] += 1
                if connection is not None:
                    connection.close()
                return
        established.append(connection)

    await asyncio.gather(*(open_one(n, job_id) for n, job_id in enumerate(job_ids)))
    return established, failures
