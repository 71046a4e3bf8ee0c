"""How many SSE streams each client address holds open, with a cap per address."""

from __future__ import annotations

from collections import Counter

from fastapi import HTTPException, Request

# What a refused client is told to wait (429 past the cap, 503 while a dependency is down).
RETRY_AFTER_S = 5


class ClientStreams:
    """Counts the open streams per client address; `acquire` refuses past `max_per_client`.

    The address is the one uvicorn reports: behind a proxy it trusts (`--forwarded-allow-ips`),
    the client's own; otherwise the proxy's, so set the cap with the proxy in mind.
    """

    def __init__(self, max_per_client: int) -> None:
        self._max = max_per_client
        self._open: Counter[str] = Counter()

    def acquire(self, client: str) -> bool:
        if self._open[client] >= self._max:
            return False
        self._open[client] += 1
        return True

    def release(self, client: str) -> None:
        self._open[client] -= 1
        if self._open[client] <= 0:
            del self._open[client]

    def open_streams(self, client: str) -> int:
        return self._open[client]


def hold_stream(request: Request, streams: ClientStreams) -> str:
    """Count one more stream for the request's client address; 429 past the cap.

    Returns the address, for the `release` once the stream ends.
    """
    client = request.client.host if request.client else "unknown"
    if not streams.acquire(client):
        raise HTTPException(
            429,
            "too many open streams from this address",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return client
