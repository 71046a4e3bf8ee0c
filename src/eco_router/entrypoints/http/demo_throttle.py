"""Throttling the demo endpoint that starts jobs: token buckets per client and per process."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

DEMO_JOBS_PATH = "/api/v1/demo/jobs"
# The most demo jobs one request starts (a dashboard's).
MAX_DEMO_JOBS_PER_REQUEST = 20


@dataclass(slots=True)
class TokenBucket:
    """`burst` tokens at most, refilled at `rate` per second; one token per request."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate=rate, burst=burst, tokens=burst, updated=now)

    def wait_s(self, now: float, need: int = 1) -> float:
        """Seconds until `need` tokens are available (0 when they are now); takes nothing."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        return 0.0 if self.tokens >= need else (need - self.tokens) / self.rate

    def take(self, count: int = 1) -> None:
        self.tokens -= count


class Throttle:
    """One bucket per client address and one for the whole process; a request needs both.

    The process bucket bounds the work all clients together can start; the client buckets
    keep one client from using it all. Only the `max_clients` most recent addresses keep a
    bucket, so memory stays bounded (a forgotten client starts again with a full bucket).
    """

    def __init__(
        self,
        *,
        rate: float,
        burst: float,
        client_rate: float,
        client_burst: float,
        max_clients: int = 1024,
        now: float = 0.0,
    ) -> None:
        self._process = TokenBucket.full(rate, burst, now)
        self._client_rate = client_rate
        self._client_burst = client_burst
        self._max_clients = max_clients
        self._clients: OrderedDict[str, TokenBucket] = OrderedDict()

    def admit(self, client: str, now: float, *, jobs: int = 1) -> float:
        """0 when the request may go ahead (tokens are taken), else the seconds to wait.

        A request for several `jobs` (a dashboard's) is one request of its client, and as
        many jobs of the process: what all clients together start stays bounded."""
        bucket = self._clients.pop(client, None) or TokenBucket.full(
            self._client_rate, self._client_burst, now
        )
        self._clients[client] = bucket
        if len(self._clients) > self._max_clients:
            self._clients.popitem(last=False)
        wait = max(bucket.wait_s(now), self._process.wait_s(now, jobs))
        if wait == 0:
            bucket.take()
            self._process.take(jobs)
        return wait


class DemoJobThrottle:
    """ASGI middleware: a `POST` that starts a demo job past the throttle gets 429.

    A middleware rather than a route dependency so the SSE routes' module keeps no knowledge
    of it; every other request passes straight through.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        throttle: Throttle,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._throttle = throttle
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == DEMO_JOBS_PATH
            and scope["method"] == "POST"
        ):
            client = scope.get("client")
            jobs = requested_jobs(scope.get("query_string", b""))
            wait = self._throttle.admit(client[0] if client else "", self._clock(), jobs=jobs)
            if wait > 0:
                retry_after = max(1, math.ceil(wait))
                response = JSONResponse(
                    {"detail": f"too many demo jobs started: try again in {retry_after} s"},
                    status_code=429,
                    headers={"Retry-After": str(retry_after)},
                )
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)


def requested_jobs(query_string: bytes) -> int:
    """The jobs a request to start demo jobs asks for (`count`, 1 without it or when it is
    not a count the route takes: the route refuses those)."""
    values = parse_qs(query_string.decode("latin-1")).get("count", [])
    if len(values) == 1 and values[0].isdigit():
        return max(1, min(int(values[0]), MAX_DEMO_JOBS_PER_REQUEST))
    return 1
