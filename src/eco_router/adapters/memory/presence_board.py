"""In-memory adapter of `PresenceBoard`: the gateways' counts in one process, with their TTL."""

from __future__ import annotations

from collections.abc import Mapping

from eco_router.application.errors import TransientError
from eco_router.application.ports import Clock, JobRef, PresenceBoard


class InMemoryPresenceBoard(PresenceBoard):
    """Each gateway's counts with their expiry on `clock`; lapsed ones are dropped on reading.
    Set `available = False` to cut it off; `posts` counts the posts it took."""

    def __init__(self, *, clock: Clock, ttl_s: float) -> None:
        self.available = True
        self.posts = 0
        self._clock = clock
        self._ttl_s = ttl_s
        self._boards: dict[str, tuple[float, dict[JobRef, int]]] = {}

    async def post(self, gateway: str, changes: Mapping[JobRef, int], *, whole: bool) -> bool:
        self._check()
        self.posts += 1
        now = self._clock.monotonic()
        known = self._boards.get(gateway)
        if known is None or known[0] <= now:
            if not whole:
                return False
            known = None
        counts = {} if whole or known is None else known[1]
        for job, count in changes.items():
            if count > 0:
                counts[job] = count
            else:
                counts.pop(job, None)
        self._boards[gateway] = (now + self._ttl_s, counts)
        return True

    async def leave(self, gateway: str) -> None:
        self._check()
        self._boards.pop(gateway, None)

    async def viewers(self, domain: str, job_id: str) -> dict[str, int]:
        self._check()
        now = self._clock.monotonic()
        for lapsed in [g for g, (expiry, _) in self._boards.items() if expiry <= now]:
            del self._boards[lapsed]
        job = (domain, job_id)
        return {g: counts[job] for g, (_, counts) in self._boards.items() if job in counts}

    def _check(self) -> None:
        if not self.available:
            raise TransientError("in-memory presence board marked unavailable")
