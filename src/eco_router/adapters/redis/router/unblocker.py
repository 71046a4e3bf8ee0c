"""Waking a blocking command on a pinned connection from another one (CLIENT UNBLOCK)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from redis.exceptions import ResponseError

from eco_router.adapters.redis.connections.connection import PinnedReader, RedisClient
from eco_router.adapters.redis.errors import port_error, redis_errors
from eco_router.application.errors import PermanentError

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.001
LAST_RETRY_S = 0.05


class Unblocker:
    """Tracks the one blocking command in flight on `reader` and wakes it on demand.

    A wake that comes before the command reached the server is retried until it lands or the
    command ended; one that comes while none is in flight makes the next one not block, so a
    wake is never lost between the caller deciding to block and the server blocking. A server
    that refuses CLIENT UNBLOCK or CLIENT ID for good (an ACL without them) makes it
    unusable, once, with a warning: the caller waits another way.
    """

    def __init__(self, redis: RedisClient, reader: PinnedReader) -> None:
        self._redis = redis
        self._reader = reader
        self._done: asyncio.Event | None = None
        self._woken = False
        self.refused: PermanentError | None = None

    @property
    def usable(self) -> bool:
        if self.refused is None and self._reader.refused is not None:
            self._refuse(PermanentError("", self._reader.refused))
        return self.refused is None

    def _refuse(self, error: PermanentError) -> None:
        self.refused = error
        log.warning(
            "blocking reads are off, the router waits for appends with XREAD instead: %s",
            error.cause,
        )

    @contextlib.contextmanager
    def blocking(self, block_ms: int) -> Iterator[int]:
        """Around one blocking command: the milliseconds it may block, 0 when a wake came
        before it began."""
        done = self._done = asyncio.Event()
        block = 0 if self._woken else block_ms
        self._woken = False
        try:
            yield block
        finally:
            done.set()
            self._done = None

    async def wake(self) -> None:
        """Wake the blocking command in flight (it returns what it has); without one, the
        next one does not block."""
        done = self._done
        if done is None:
            self._woken = True
            return
        delay = FIRST_RETRY_S
        while not done.is_set() and self.usable:
            client_id = self._reader.client_id
            if client_id is not None and await self._unblock(client_id):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), delay)
            delay = min(delay * 2, LAST_RETRY_S)

    async def _unblock(self, client_id: int) -> bool:
        with redis_errors("CLIENT UNBLOCK"):
            try:
                return bool(await self._redis.client_unblock(client_id))
            except ResponseError as error:
                refused = port_error(error, "CLIENT UNBLOCK")
                if isinstance(refused, PermanentError):
                    self._refuse(refused)
                raise refused from error
