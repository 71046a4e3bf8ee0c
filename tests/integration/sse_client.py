"""A small Server-Sent Events client for tests: frames as (id, event, data), with deadlines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

TERMINAL_EVENTS = frozenset({"done", "error"})


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched frame: its `id` line (None when it has none), its event name and data."""

    id: str | None
    event: str
    data: str

    @property
    def seq(self) -> int:
        assert self.id is not None, f"{self.event} frame has no id"
        return int(self.id)

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL_EVENTS

    def json(self) -> Any:
        return orjson.loads(self.data)


class SseStream:
    """An open SSE response: its status and headers, then its events as they arrive.

    Reads never wait forever: each one has a deadline and fails the test with what came so far.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.events: list[SseEvent] = []
        self.comments: list[str] = []
        self.ended = False
        self._lines = response.aiter_lines()

    @property
    def status_code(self) -> int:
        return self.response.status_code

    async def next_event(self, timeout_s: float = 10.0) -> SseEvent | None:
        """The next event, or None once the server has ended the stream."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._next()
        except TimeoutError:
            raise AssertionError(
                f"no SSE event within {timeout_s} s; events so far: {self.events}"
            ) from None

    async def read(
        self, count: int | None = None, *, timeout_s: float = 10.0, stop_at_terminal: bool = True
    ) -> list[SseEvent]:
        """Events until `count` of them, a terminal event or the end of the stream.

        `timeout_s` bounds the whole read.
        """
        deadline = time.monotonic() + timeout_s
        got: list[SseEvent] = []
        while count is None or len(got) < count:
            event = await self.next_event(max(deadline - time.monotonic(), 0.001))
            if event is None:
                break
            got.append(event)
            if stop_at_terminal and event.terminal:
                break
        return got

    async def read_to_end(self, timeout_s: float = 15.0) -> list[SseEvent]:
        """Every event until the server ends the stream; fails if it is open at the deadline."""
        got = await self.read(timeout_s=timeout_s, stop_at_terminal=False)
        assert self.ended
        return got

    async def _next(self) -> SseEvent | None:
        event_id: str | None = None
        name = ""
        data: list[str] = []
        async for line in self._lines:
            if not line:
                if data:
                    event = SseEvent(event_id, name or "message", "\n".join(data))
                    self.events.append(event)
                    return event
                event_id, name = None, ""
                continue
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "id":
                event_id = value
            elif field == "event":
                name = value
            elif field == "data":
                data.append(value)
            # `retry` and unknown fields are ignored, as browsers do.
        self.ended = True
        return None


def sse_client(base_url: str) -> httpx.AsyncClient:
    """An HTTP client for a gateway; reads may idle for a while between events."""
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(10.0, read=60.0),
        limits=httpx.Limits(max_connections=200),
        trust_env=False,
    )


@asynccontextmanager
async def open_sse(
    client: httpx.AsyncClient,
    path: str,
    *,
    params: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[SseStream]:
    """GET `path` as an event stream; the connection is closed on exit."""
    request_headers = {"Accept": "text/event-stream", **(headers or {})}
    async with client.stream("GET", path, params=params, headers=request_headers) as response:
        yield SseStream(response)


async def read_events(
    client: httpx.AsyncClient,
    path: str,
    *,
    count: int | None = None,
    timeout_s: float = 10.0,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> list[SseEvent]:
    """Open, read until `count` events, a terminal event or the end, and disconnect."""
    async with open_sse(client, path, params=params, headers=headers) as stream:
        assert stream.status_code == 200, (stream.status_code, await stream.response.aread())
        return await stream.read(count, timeout_s=timeout_s)
