"""Writing SSE frames straight to a uvicorn connection, beside the ASGI response's writes."""

from __future__ import annotations

import functools
from typing import Any

from eco_router.application.ports import FrameWriter

# The scope extension under which the server hands a request its writer.
FRAME_WRITER = "eco_router.frame_writer"


@functools.lru_cache(maxsize=1024)
def http_chunk(frame: bytes) -> bytes:
    """`frame` as one HTTP/1.1 chunk: built once per event, the same bytes for every viewer
    (a bytes object caches its hash, so the lookup costs one comparison by identity)."""
    return b"%x\r\n%s\r\n" % (len(frame), frame)


class TransportFrameWriter(FrameWriter):
    """Writes chunks of a chunked HTTP/1.1 response on the connection's transport.

    The response's own writes (headers, the replay, the end) go through uvicorn as usual;
    these chunks only go out between them, which `writable` ensures: the response has
    started and not completed, and the connection is open and not paused for writing.
    """

    __slots__ = ("_cycle", "_flow", "_transport")

    def __init__(self, cycle: Any, transport: Any, flow: Any) -> None:
        self._cycle = cycle
        self._transport = transport
        self._flow = flow

    def writable(self) -> bool:
        cycle = self._cycle
        return bool(
            cycle.response_started
            and not cycle.response_complete
            and not cycle.disconnected
            and not self._flow.write_paused
            and not self._transport.is_closing()
        )

    def write(self, frame: bytes) -> None:
        self._transport.write(http_chunk(frame))
