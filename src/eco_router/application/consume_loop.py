"""The consumer: takes over and reads the shards this router holds, batch after batch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence

from eco_router.application.backoff import Backoff
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.held_shards import HeldShards, Phase, streams_of
from eco_router.application.messages import Delivery, ReadBatch
from eco_router.application.ports import Clock, EventSource, RouterMetrics
from eco_router.application.route_batch import RouteBatch
from eco_router.application.router_health import RouterHealth
from eco_router.application.stopping import sleep_unless_stopped
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import StreamFamily, shard_of

log = logging.getLogger(__name__)

Fence = Mapping[str, int]


class ConsumeLoop:
    """Route the held shards in stream order; the one place that decides retry or move on.

    - Take-over first: a newly held shard's pending entries (left by whoever held it before,
      this router's earlier self included) are claimed page by page, in id order, and routed
      before any new entry of it is read. They are older than every entry not yet delivered,
      so each job's events are routed in stream order across holders.
    - New entries: one read over the shards being read, without waiting, checked for gaps
      (entries after this router's position pending elsewhere, or taken by a read whose reply
      was lost): a shard with a gap is taken over again, so those come first. Behind a
      backlog the next batch is read while this one is routed; once a read has drained the
      shards, the loop waits for an append (after the marks the read gave), a change of held
      shards, or stop, before reading again.
    - A fenced shard (another router holds it now) is dropped with what is in hand of it,
      unacked: its new holder claims those entries.
    - Transient errors (a server unreachable, a publish that failed): keep the batch in
      memory, back off exponentially (bounded) and route it again; read nothing new meanwhile.
      A read that failed may have taken entries whose reply was lost: its shards are taken
      over again (their pending entries claimed and routed) before anything newer is read.
    - A shard the server refuses for good (a key of the wrong type) is quarantined
      (`RouterHealth`): not read nor claimed, tried again every so often; the others go on.
    - A group that vanished (XGROUP DESTROY) is created again at this router's position on
      the shard, so nothing already routed is read again.
    - Any other error: log it and leave the batch pending for the reclaimer, which brings it
      back with its delivery count, so a poison entry ends in the dead-letter stream.
    - Stop: nothing new is read or claimed; the batch in flight is finished (routed and acked)
      within `drain_grace_s`, whatever is still unsettled after that stays pending.
    """

    def __init__(
        self,
        *,
        source: EventSource,
        route: RouteBatch,
        held: HeldShards,
        metrics: RouterMetrics,
        clock: Clock,
        read_count: int,
        block_ms: int,
        backoff: Backoff | None = None,
        drain_grace_s: float = 6.0,
        health: RouterHealth | None = None,
    ) -> None:
        self._source = source
        self._route = route
        self._held = held
        self._metrics = metrics
        self._clock = clock
        self._read_count = read_count
        self._block_ms = block_ms
        self._backoff = backoff or Backoff()
        self._drain_grace_s = drain_grace_s
        self._family_of: dict[str, StreamFamily] = {
            s: f for f in source.families for s in f.streams
        }
        self._prefetch: tuple[asyncio.Task[ReadBatch], dict[str, int]] | None = None
        self._drained: tuple[Mapping[str, str], dict[str, int]] | None = None
        self._finishing: set[str] = set()
        self.health = health or RouterHealth(clock=clock, metrics=metrics, families=source.families)
        self._runs = 0
        self.prepared = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        if self._runs:
            # Restarted after dying: what it had in hand is pending to it, claim that first.
            self._held.take_over_again(self._held.streams())
            self._prefetch, self._drained = None, None
            self._finishing.clear()
        self._runs += 1
        if not await self._prepare(stop):
            return
        unsettled: Sequence[Delivery] = ()
        fence: Fence = {}
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
                failed = False
                try:
                    if not batch:
                        batch, fence = await self._next_batch(stop)
                    unsettled = await self._settle(batch, fence) if batch else ()
                    failed = bool(unsettled)
                    if not unsettled:
                        self._finish_take_overs()
                except TransientError as error:
                    self.health.troubled("consumer", error)
                    unsettled, failed = batch, True
                except PermanentError as error:
                    self._held.put_down(streams_of(batch))
                    unsettled = ()
                    if error.key in self._family_of:
                        # Refused for good on one shard (its ack): the rest of the batch settled.
                        self.health.quarantine(error.key, error)
                        self._finishing.discard(error.key)
                    else:
                        # A job's key, say: poison for the reclaimer, like any other error.
                        log.error("routing refused, the batch stays pending: %s", error)
                        self._finishing.clear()
                        failed = True
                except Exception:
                    log.exception("routing failed; the batch stays pending for the reclaimer")
                    self._held.put_down(streams_of(batch))
                    self._finishing.clear()
                    unsettled, failed = (), True
                if failed:
                    await self._pause(stop, stop_deadline)
                else:
                    self._backoff.reset()
                    self.health.untroubled("consumer")
        finally:
            await self._cancel_prefetch()

    async def _prepare(self, stop: asyncio.Event) -> bool:
        while not stop.is_set():
            try:
                broken = await self._source.prepare()
            except TransientError as error:
                self.health.troubled("consumer", error)
                await sleep_unless_stopped(stop, self._backoff.next_delay())
                continue
            self._backoff.reset()
            self.health.untroubled("consumer")
            for stream, refused in broken.items():
                self.health.quarantine(stream, refused)
            self.prepared.set()
            return True
        return False

    def _reading(self) -> dict[str, int]:
        """Stream → token of the shards to read: reading and not quarantined."""
        blocked = self.health.blocked()
        return {s: t for s, t in self._held.tokens([Phase.READING]).items() if s not in blocked}

    def _taking_over(self) -> list[str]:
        blocked = self.health.blocked()
        return [s for s in self._held.taking_over() if s not in blocked]

    async def _probe_quarantined(self) -> None:
        """Try the quarantined shards that are due: once the group can be created, a held
        one is taken over again (its claim and reads tell whether it works); one held
        elsewhere works as far as this router can tell."""
        # A shard given up while it was being tried is no longer this router's to judge.
        self.health.worked(s for s in self.health.probing() if not self._routing(s))
        for stream in self.health.due():
            broken = await self._source.prepare([stream])
            if stream in broken:
                self.health.quarantine(stream, broken[stream])
                continue
            self.health.probe(stream)
            if self._routing(stream):
                self._held.take_over_again([stream])
            else:
                self.health.worked([stream])

    def _routing(self, stream: str) -> bool:
        held = self._held.get(stream)
        return held is not None and held.phase is not Phase.RELEASING

    async def _next_batch(self, stop: asyncio.Event) -> tuple[list[Delivery], Fence]:
        if self._prefetch is not None:
            read, tokens = self._prefetch
            self._prefetch = None
            return await self._take_read(await read, tokens, stop)
        if stop.is_set():
            return [], {}
        # Cleared before looking, so a shard gained while a claim below awaits still wakes
        # the wait for work.
        self._held.changed.clear()
        await self._probe_quarantined()
        for stream in self._taking_over():
            claimed = await self._claim_left(stream)
            if claimed is not None:
                return claimed
        tokens = self._reading()
        if not tokens:
            await self._wait_for_work(stop)
            return [], {}
        drained, self._drained = self._drained, None
        if drained is not None and drained[1] == tokens:
            # The last read took everything there was: wait for an append before reading.
            await self._wait_for_work(stop, drained[0])
            return [], {}
        read = self._start_read(tokens)
        return await self._take_read(await read, tokens, stop)

    async def _claim_left(self, stream: str) -> tuple[list[Delivery], Fence] | None:
        """The next page of what earlier holders left on `stream`; None once none is left."""
        held = self._held.get(stream)
        if held is None:
            return None
        try:
            page = await self._source.claim(
                stream, token=held.token, cursor=held.cursor, min_idle_ms=0, count=self._read_count
            )
        except PermanentError as error:
            self.health.quarantine(stream, error)
            self._finishing.discard(stream)
            return None
        if page.fenced:
            self._lost(stream)
            return None
        self.health.worked([stream])
        if page.last_delivered is not None:
            held.last_id = page.last_delivered
        if page.deliveries:
            # A previous holder that had not noticed its loss may have read past where the
            # take-over began, and those entries are claimed here: the position moves past
            # them, or reads that bring nothing would wait after them and return at once.
            last = max(StreamEntryId.parse(d.entry_id) for d in page.deliveries)
            if last > StreamEntryId.parse(held.last_id):
                held.last_id = str(last)
        held.cursor = page.cursor
        held.claimed += len(page.deliveries)
        if page.wrapped:
            self._finishing.add(stream)
        if not page.deliveries:
            self._finish_take_overs()
            return None
        self._held.picked_up(streams_of(page.deliveries))
        return page.deliveries, {stream: held.token}

    def _finish_take_overs(self) -> None:
        for stream in self._finishing:
            held = self._held.took_over(stream)
            if held is None:
                continue
            if held.again:
                held.again = False
                continue
            seconds = self._clock.monotonic() - held.acquired_s
            family = self._family_of[stream]
            self._metrics.taken_over(
                family.domain, shard_of(stream), claimed=held.claimed, seconds=seconds
            )
            if held.claimed:
                log.info(
                    "took over %s: %d entries left pending routed in %.3f s",
                    stream,
                    held.claimed,
                    seconds,
                )
        self._finishing.clear()

    def _start_read(self, tokens: dict[str, int]) -> asyncio.Task[ReadBatch]:
        # A read in flight holds its shards: none is handed over before its entries settle.
        self._held.picked_up(tokens)
        after = {s: last for s, last in self._held.reading().items() if s in tokens}
        return asyncio.ensure_future(self._read(tokens, after))

    async def _read(self, tokens: dict[str, int], after: dict[str, str]) -> ReadBatch:
        try:
            batch = await self._source.read_new(after, count=self._read_count)
            self._held.picked_up(streams_of(batch.deliveries))
            # Entries come in id order per stream: the last one of each is the new position.
            last = {d.stream: d.entry_id for d in batch.deliveries}
            for stream, entry_id in last.items():
                held = self._held.get(stream)
                if held is not None and held.token == tokens[stream]:
                    held.last_id = entry_id
            return batch
        except TransientError:
            # The server may have read and lost only the reply: those entries are pending to
            # this router now, older than anything a next read brings. Take the shards over
            # again, so they are claimed and routed first.
            self._held.take_over_again(tokens)
            raise
        finally:
            self._held.put_down(tokens)

    async def _take_read(
        self, read: ReadBatch, tokens: dict[str, int], stop: asyncio.Event
    ) -> tuple[list[Delivery], Fence]:
        for stream, error in read.broken.items():
            self.health.quarantine(stream, error)
        self.health.worked(s for s in tokens if s not in read.broken)
        for stream, position in read.regrouped.items():
            log.error(
                "the consumer group on %s was gone; created again %s",
                stream,
                "from the start (the stream was deleted)"
                if position in ("0", "0-0")
                else f"after {position}, the last entry this router read there",
            )
        if read.gaps:
            # A router that lost these shards read entries of them after this one's last:
            # take the shards over again, so those come first, then what was just read.
            log.warning("entries of %s were read by a router that lost them", sorted(read.gaps))
            self._held.take_over_again(read.gaps)
        batch = self._still_reading(read, tokens)
        if batch.deliveries:
            following = self._reading()
            if batch.marks:
                self._drained = (batch.marks, tokens)
            elif following and not stop.is_set() and not self._taking_over():
                # The next batch is read while this one is routed: its round trip overlaps
                # the Lua call and the publish. Batches are still routed one after another.
                self._prefetch = (self._start_read(following), following)
            return batch.deliveries, tokens
        if tokens == self._reading() and not self._taking_over() and not read.broken:
            await self._wait_for_work(stop, batch.marks)
        return [], {}

    def _still_reading(self, read: ReadBatch, tokens: dict[str, int]) -> ReadBatch:
        """`read` without the entries of shards no longer read under the same token (lost,
        or taken over again): they stay pending, for whoever takes the shard over."""
        keep = {
            s
            for s, token in tokens.items()
            if s not in read.gaps
            and (held := self._held.get(s)) is not None
            and held.token == token
            and held.phase is not Phase.TAKING_OVER
        }
        dropped = [d for d in read.deliveries if d.stream not in keep]
        if not dropped:
            return read
        self._held.put_down(streams_of(dropped))
        kept = [d for d in read.deliveries if d.stream in keep]
        return ReadBatch(kept, read.gaps, read.marks)

    async def _wait_for_work(
        self, stop: asyncio.Event, marks: Mapping[str, str] | None = None
    ) -> None:
        """Until an entry is appended after `marks`, the held shards change, or stop."""
        waits: list[asyncio.Future[object]] = [
            asyncio.ensure_future(self._held.changed.wait()),
            asyncio.ensure_future(stop.wait()),
        ]
        if marks:
            waits.append(
                asyncio.ensure_future(self._source.wait_for_new(marks, block_ms=self._block_ms))
            )
        try:
            # A quarantined shard's retry wakes the loop too.
            done, _ = await asyncio.wait(
                waits, timeout=self.health.next_retry_s(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
            for wait in waits:
                with contextlib.suppress(BaseException):
                    await wait
        for wait in done:
            wait.result()  # a failed wait for appends is a transient error to back off from

    async def _settle(self, batch: Sequence[Delivery], fence: Fence) -> list[Delivery]:
        result = await self._route(batch, fence)
        if result.error is not None:
            self.health.troubled("consumer", result.error)
        for stream in result.fenced:
            self._lost(stream)
        if not result.unsettled:
            self._held.put_down(streams_of(batch))
            return []
        kept = {(d.stream, d.entry_id) for d in result.unsettled}
        self._held.put_down(streams_of(d for d in batch if (d.stream, d.entry_id) not in kept))
        return result.unsettled

    def _lost(self, stream: str) -> None:
        if self._held.lose(stream) is not None:
            log.warning("%s is held by another router now; dropping what is in hand", stream)
            self._metrics.lease_lost(self._family_of[stream].domain, shard_of(stream))
            self._metrics.shard_held(self._family_of[stream].domain, shard_of(stream), None)
        self._finishing.discard(stream)

    async def _cancel_prefetch(self) -> None:
        if self._prefetch is None:
            return
        read, _ = self._prefetch
        self._prefetch = None
        read.cancel()
        with contextlib.suppress(BaseException):
            await read

    async def _pause(self, stop: asyncio.Event, stop_deadline: float | None) -> None:
        delay = self._backoff.next_delay()
        if stop_deadline is None:
            await sleep_unless_stopped(stop, delay)
        else:
            await asyncio.sleep(max(0.0, min(delay, stop_deadline - time.monotonic())))
