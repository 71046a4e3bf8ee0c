"""The consumer: reads the streams and routes batch after batch until asked to stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from eco_router.application.backoff import Backoff
from eco_router.application.errors import TransientError
from eco_router.application.messages import Delivery
from eco_router.application.ports import EventSource
from eco_router.application.route_batch import RouteBatch
from eco_router.application.stopping import sleep_unless_stopped

log = logging.getLogger(__name__)

# Another consumer usually routes the entry we wait for within a few milliseconds.
ORDER_RECHECK_S = 0.002
ORDER_RECHECK_MAX_S = 0.05


class ConsumeLoop:
    """Read, route, repeat; the one place that decides between retry and moving on.

    - Startup: create missing groups, then finish this consumer's own pending entries
      (left by an earlier process of the same name) before reading new ones.
    - Transient errors (a server unreachable, a publish that failed): keep the batch in
      memory, back off exponentially (bounded) and route it again; read nothing new meanwhile.
    - Any other error: log it and leave the batch pending; the reclaimer brings it back with
      its delivery count, so a poison entry ends in the dead-letter stream instead of a loop.
    - Stop: no new read; an in-flight read and batch are finished (routed and acked) within
      `drain_grace_s`, whatever is still unsettled after that stays pending for others.
    - Order across consumers: the entries of a new batch whose job has an older entry still
      pending at another consumer wait (up to `order_wait_ms`, re-checked with a short
      back-off) until that one is routed, so a job's events are applied and published in
      stream order; the batch's other jobs go at once. Nothing new is read while they wait.
      `order_wait_ms=0` turns this off.
    """

    def __init__(
        self,
        *,
        source: EventSource,
        route: RouteBatch,
        read_count: int,
        block_ms: int,
        backoff: Backoff | None = None,
        drain_grace_s: float = 6.0,
        order_wait_ms: int = 0,
    ) -> None:
        self._source = source
        self._route = route
        self._read_count = read_count
        self._block_ms = block_ms
        self._backoff = backoff or Backoff()
        self._drain_grace_s = drain_grace_s
        self._order_wait_ms = order_wait_ms
        self._prefetch: asyncio.Task[list[Delivery]] | None = None
        self.recovered = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        if not await self._prepare(stop):
            return
        own_cursor = {s: "0-0" for f in self._source.families for s in f.streams}
        recovering = True
        unsettled: Sequence[Delivery] = ()
        stop_deadline: float | None = None
        try:
            while True:
                if stop.is_set():
                    stop_deadline = stop_deadline or time.monotonic() + self._drain_grace_s
                    if not unsettled and self._prefetch is None:
                        return
                    if unsettled and time.monotonic() >= stop_deadline:
                        log.warning("stopping with %d entries left pending", len(unsettled))
                        return
                batch: Sequence[Delivery] = unsettled
                failed = fresh = False
                try:
                    if not batch and recovering:
                        batch = await self._source.read_own_pending(
                            after=own_cursor, count=self._read_count
                        )
                        recovering = bool(batch)
                        if not recovering:
                            self.recovered.set()
                        for delivery in batch:
                            own_cursor[delivery.stream] = delivery.entry_id
                    elif not batch:
                        batch = await self._read_new(stop)
                        if batch and not stop.is_set():
                            self._start_read()
                        fresh = True
                    if fresh:
                        unsettled = await self._route_in_order(batch, stop)
                    else:
                        unsettled = (await self._route(batch)).unsettled if batch else ()
                    failed = bool(unsettled)
                except TransientError as error:
                    log.warning("transient failure, will retry: %s", error)
                    unsettled, failed = batch, True
                except Exception:
                    log.exception("routing failed; the batch stays pending for the reclaimer")
                    unsettled, failed = (), True
                if failed:
                    await self._pause(stop, stop_deadline)
                else:
                    self._backoff.reset()
        finally:
            await self._cancel_prefetch()

    async def _prepare(self, stop: asyncio.Event) -> bool:
        while not stop.is_set():
            try:
                await self._source.prepare()
                self._backoff.reset()
                return True
            except TransientError as error:
                log.warning("cannot create consumer groups yet: %s", error)
                await sleep_unless_stopped(stop, self._backoff.next_delay())
        return False

    async def _route_in_order(
        self, batch: Sequence[Delivery], stop: asyncio.Event
    ) -> list[Delivery]:
        """Route `batch`, holding back the jobs another consumer has older entries of."""
        if not batch:
            return []
        held = await self._overtaking(batch)
        unsettled: list[Delivery] = []
        deadline = time.monotonic() + self._order_wait_ms / 1000
        delay_s = ORDER_RECHECK_S
        while True:
            ready = [d for d in batch if (d.stream, d.entry_id) not in held]
            if ready:
                unsettled += (await self._route(ready)).unsettled
            batch = [d for d in batch if (d.stream, d.entry_id) in held]
            if not batch:
                return unsettled
            if stop.is_set() or time.monotonic() >= deadline:
                log.info("routing %d entries without waiting longer for older ones", len(batch))
                return unsettled + list((await self._route(batch)).unsettled)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, ORDER_RECHECK_MAX_S)
            held = await self._overtaking(batch)

    async def _overtaking(self, batch: Sequence[Delivery]) -> set[tuple[str, str]]:
        if not self._order_wait_ms:
            return set()
        try:
            return await self._source.overtaking(batch, max_idle_ms=self._order_wait_ms)
        except TransientError as error:
            # Order is best effort: a batch is not held back for a server that fails to tell.
            log.warning("cannot look for older pending entries: %s", error)
            return set()

    def _start_read(self) -> asyncio.Task[list[Delivery]]:
        # The next batch is read while this one is routed: its round trip and reply parsing
        # overlap the Lua call and the publish. Batches are still routed one after another.
        self._prefetch = asyncio.ensure_future(
            self._source.read_new(count=self._read_count, block_ms=self._block_ms)
        )
        return self._prefetch

    async def _read_new(self, stop: asyncio.Event) -> list[Delivery]:
        read = self._prefetch or self._start_read()
        self._prefetch = None
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if read.done():
            return read.result()
        # Entries a blocked read takes are ours once it returns: let it finish and route them.
        try:
            async with asyncio.timeout(self._drain_grace_s):
                return await read
        except TimeoutError:
            return []
        finally:
            if not read.done():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read

    async def _cancel_prefetch(self) -> None:
        read, self._prefetch = self._prefetch, None
        if read is not None:
            read.cancel()
            with contextlib.suppress(BaseException):
                await read

    async def _pause(self, stop: asyncio.Event, stop_deadline: float | None) -> None:
        delay = self._backoff.next_delay()
        if stop_deadline is None:
            await sleep_unless_stopped(stop, delay)
        else:
            await asyncio.sleep(max(0.0, min(delay, stop_deadline - time.monotonic())))
