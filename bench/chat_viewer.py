"""The chat benchmark's viewer: one SSE stream of one answer, every frame checked.

A `ChatViewer` is `bench.sse_client.SseConnection` (raw socket, HTTP/1.1 chunks, SSE frames)
with its own frame handling: it tells tokens apart by their content (`bench.chat_entries`),
so it counts each token delivered, repeated or missing whatever ids the gateway gives, and
keeps the answer's text as a browser would: a `token_recovery` frame replaces it with its
`accumulated`, a token appends its `content`. It also checks the SSE ids (never repeated,
always rising; `prev_event_id`, when the payload has one, names the id received before) and,
on a terminal event with a `text_check`, its text against the check's SHA-1.

Thousands of viewers of one answer receive the same frames: a `FrameParser` made with
`shared=True` parses each distinct frame once for all of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bench.chat_entries import answer_text, token_number
from bench.sse_client import CONNECT_CONCURRENCY, CONNECT_TIMEOUT_S, SseConnection, Tally
from eco_router.domain.event import FIRST_TOKEN_SEQ

RECOVERY_EVENT = b"token_recovery"
TERMINAL_EVENTS = frozenset({b"done", b"error"})
SHARED_CACHE_LIMIT = 20_000


@dataclass(frozen=True, slots=True)
class ParsedFrame:
    """One SSE frame as the viewer needs it."""

    name: bytes | None
    event_id: int | None
    data: dict[str, Any] | None
    token: int | None  # a token's number, from its content
    sent_ms: float | None  # the writer's `ts`, else the entry id's milliseconds
    size: int  # bytes on the stream, with the blank line ending it
    raw: bytes


class FrameParser:
    """Frames to `ParsedFrame`s; with `shared`, each distinct frame is parsed once."""

    def __init__(self, *, shared: bool = False) -> None:
        self._cache: dict[bytes, ParsedFrame] | None = {} if shared else None

    def parse(self, frame: bytes) -> ParsedFrame:
        cache = self._cache
        if cache is None:
            return _parse(frame)
        parsed = cache.get(frame)
        if parsed is None:
            if len(cache) >= SHARED_CACHE_LIMIT:
                cache.clear()
            parsed = cache[frame] = _parse(frame)
        return parsed


def _parse(frame: bytes) -> ParsedFrame:
    name = event_id = data = None
    for line in frame.split(b"\n"):
        key, _, value = line.partition(b": ")
        if key == b"event":
            name = value
        elif key == b"id":
            event_id = int(value)
        elif key == b"data":
            data = orjson.loads(value)
    token = sent_ms = None
    if isinstance(data, dict):
        content = data.get("content")
        if isinstance(content, str):
            token = token_number(content)
        sent_ms = _sent_ms(data)
    return ParsedFrame(name, event_id, data, token, sent_ms, len(frame) + 2, frame)


def _sent_ms(data: dict[str, Any]) -> float | None:
    ts = data.get("ts")
    if isinstance(ts, str | int | float) and not isinstance(ts, bool):
        try:
            return float(ts) * 1000
        except ValueError:
            pass
    stream_id = data.get("stream_id")
    if isinstance(stream_id, str) and stream_id.partition("-")[0].isdigit():
        return float(stream_id.partition("-")[0])
    return None


def _kind(frame: ParsedFrame) -> str:
    """`token` for a token, else the frame's event name."""
    if frame.token is not None:
        return "token"
    return (frame.name or b"message").decode()


class AnswerLedger:
    """What one viewer of one answer received, checked frame by frame.

    `live_after`: tokens numbered above it were written after the viewer (re)connected;
    frames before the first of them are what the connection cost to catch up.
    """

    def __init__(self, job_id: str, *, live_after: int = 0) -> None:
        self.job_id = job_id
        self.live_after = live_after
        self.opened_at = time.monotonic()
        self.first_frame_s: float | None = None
        self.first_live_s: float | None = None
        self.frames_before_live = 0
        self.bytes_before_live = 0
        self.kinds_before_live: Counter[str] = Counter()
        self.frames = 0
        self.tokens: set[int] = set()
        self.token_frames = 0
        self.token_bytes = 0
        self.sample_token: bytes | None = None
        self.duplicates = 0
        self.recoveries = 0
        self.recovered_through = 0
        self._held = 0
        self.snapshots = 0
        self.stage_frames: Counter[str] = Counter()
        self.repeated_ids = 0
        self.ids_backwards = 0
        self.prev_mismatches = 0
        self.last_id: int | None = None
        self.first_id: int | None = None
        self.ended_with: str | None = None
        self.text_check: dict[str, Any] | None = None
        self.errors: Counter[str] = Counter()
        self.latencies_ms: list[float] = []
        self.latency_of: dict[int, float] = {}
        self._seen_ids: set[int] = set()
        self._text: list[str] = []
        self.expected: int | None = None
        # Every expected token held; the stream's terminal event received.
        self.complete = asyncio.Event()
        self.ended = asyncio.Event()

    # ------------------------------------------------------------------ what arrived

    def receive(self, frame: ParsedFrame, received_ms: float) -> None:
        if frame.name is None and frame.data is None:
            return  # a keepalive comment
        now = time.monotonic()
        self.frames += 1
        if self.first_frame_s is None:
            self.first_frame_s = now - self.opened_at
        live = frame.token is not None and frame.token > self.live_after
        if live and self.first_live_s is None:
            self.first_live_s = now - self.opened_at
        if self.first_live_s is None:
            self.frames_before_live += 1
            self.bytes_before_live += frame.size
            self.kinds_before_live[_kind(frame)] += 1
        self._check_id(frame)
        data = frame.data or {}
        if frame.name == b"snapshot":
            self.snapshots += 1
        elif frame.name == RECOVERY_EVENT:
            self._recover(data)
        elif frame.token is not None:
            self._token(frame, received_ms)
        else:
            self.stage_frames[(frame.name or b"message").decode()] += 1
            if frame.name == b"error":
                self.errors[str(data.get("error", data.get("status", "?")))] += 1
            check = data.get("text_check")
            if isinstance(check, dict):
                self.text_check = check
        if frame.name in TERMINAL_EVENTS:
            self.ended_with = frame.name.decode()
            self.ended.set()
        self._check_complete()

    def expect(self, tokens: int) -> None:
        """The answer has `tokens` tokens: `complete` is set once they all arrived."""
        self.expected = tokens
        self._check_complete()

    def _check_id(self, frame: ParsedFrame) -> None:
        event_id = frame.event_id
        if event_id is None:
            return
        if event_id in self._seen_ids:
            self.repeated_ids += 1
        elif self.last_id is not None and event_id < self.last_id:
            self.ids_backwards += 1
        self._seen_ids.add(event_id)
        prev = None if frame.data is None else frame.data.get("prev_event_id")
        # A resumed stream's first frame names the id before it, which this viewer may
        # never have had: check continuity from the second frame on.
        if isinstance(prev, int) and self.last_id is not None and prev != self.last_id:
            self.prev_mismatches += 1
        if self.first_id is None:
            self.first_id = event_id
        self.last_id = event_id if self.last_id is None else max(self.last_id, event_id)

    def _recover(self, data: dict[str, Any]) -> None:
        self.recoveries += 1
        accumulated = data.get("accumulated")
        self._text = [accumulated] if isinstance(accumulated, str) else []
        last_seq = data.get("last_seq")
        if isinstance(last_seq, int) and last_seq >= FIRST_TOKEN_SEQ:
            self.recovered_through = max(self.recovered_through, last_seq - FIRST_TOKEN_SEQ + 1)
        through = self.recovered_through
        self._held = through + sum(1 for n in self.tokens if n > through)

    def _token(self, frame: ParsedFrame, received_ms: float) -> None:
        n = frame.token
        assert n is not None
        self.token_frames += 1
        self.token_bytes += frame.size
        if self.sample_token is None:
            self.sample_token = frame.raw
        if n in self.tokens or n <= self.recovered_through:
            self.duplicates += 1
            return
        self.tokens.add(n)
        self._held += 1
        self._text.append(frame.data["content"] if frame.data else "")
        if frame.sent_ms is not None:
            latency = received_ms - frame.sent_ms
            self.latencies_ms.append(latency)
            self.latency_of[n] = latency

    def _check_complete(self) -> None:
        if self.expected is not None and self.held() >= self.expected:
            self.complete.set()

    # ------------------------------------------------------------------ verdicts

    def held(self) -> int:
        """Tokens the viewer has: delivered one by one or inside a recovery."""
        return self._held

    def missing(self, tokens: int) -> int:
        return max(0, tokens - self._held)

    @property
    def text(self) -> str:
        return "".join(self._text)

    def text_matches(self, tokens: int) -> bool:
        """The viewer's text is exactly the answer's first `tokens` tokens, in order."""
        return self.text == answer_text(tokens)

    def text_check_matches(self) -> bool | None:
        """The terminal event's text check agrees with the viewer's text (None: no check)."""
        check = self.text_check
        if check is None:
            return None
        text = self.text.encode()
        return len(text) == check.get("bytes") and (
            hashlib.sha1(text, usedforsecurity=False).hexdigest() == check.get("sha1")
        )


class ChatViewer(SseConnection):
    """One SSE stream of one answer, every frame recorded in its `AnswerLedger`."""

    def __init__(
        self, request: bytes, tally: Tally, ledger: AnswerLedger, parser: FrameParser
    ) -> None:
        super().__init__(request, tally, probe=True)
        self.ledger = ledger
        self._parser = parser

    def _read_headers(self) -> bool:
        # Established on its 200: a resumed stream may start with a recovery, not a snapshot.
        done = super()._read_headers()
        if done and not self.established.done():
            self.established.set_result(None)
        return done

    def _frame(self, frame: bytes, received_ms: float) -> None:
        try:
            parsed = self._parser.parse(frame)
        except (ValueError, orjson.JSONDecodeError):
            self._tally.problems[f"frame {frame[:60]!r}"] += 1
            return
        self.ledger.receive(parsed, received_ms)


def request_bytes(port: int, domain: str, job_id: str, last_event_id: int | None = None) -> bytes:
    resume = "" if last_event_id is None else f"Last-Event-ID: {last_event_id}\r\n"
    return (
        f"GET /api/v1/{domain}/{job_id}/events HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n{resume}\r\n"
    ).encode()


async def open_viewer(
    port: int,
    domain: str,
    ledger: AnswerLedger,
    tally: Tally,
    parser: FrameParser,
    *,
    last_event_id: int | None = None,
) -> ChatViewer:
    """One viewer, established (its 200 received); its ledger's clock starts here."""
    loop = asyncio.get_running_loop()
    request = request_bytes(port, domain, ledger.job_id, last_event_id)
    ledger.opened_at = time.monotonic()
    _, viewer = await loop.create_connection(
        lambda: ChatViewer(request, tally, ledger, parser), "127.0.0.1", port
    )
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await viewer.established
    except BaseException:
        viewer.close()
        raise
    return viewer


async def open_viewers(
    port: int, domain: str, ledgers: Sequence[AnswerLedger], tally: Tally, parser: FrameParser
) -> tuple[list[ChatViewer], Counter[str]]:
    """A viewer per ledger, `CONNECT_CONCURRENCY` opening at a time; the established ones and
    the failures by reason."""
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    established: list[ChatViewer] = []
    failures: Counter[str] = Counter()

    async def open_one(ledger: AnswerLedger) -> None:
        async with gate:
            try:
                established.append(await open_viewer(port, domain, ledger, tally, parser))
            except (OSError, TimeoutError) as error:
                failures[f"{type(error).__name__}: {error}".rstrip(": ")] += 1

    await asyncio.gather(*(open_one(ledger) for ledger in ledgers))
    return established, failures
