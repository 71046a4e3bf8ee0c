"""The consumer: takes over and reads the shards this router holds, batch after batch."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import cast

from eco_router.application.backoff import Backoff
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.held_shards import HeldShards, Phase, streams_of
from eco_router.application.messages import Delivery, ReadBatch, ReadStart
from eco_router.application.ports import Clock, EventSource, RouterMetrics
from eco_router.application.route_batch import RouteBatch
from eco_router.application.router_health import RouterHealth
from eco_router.application.stopping import cancel_and_wait, sleep_unless_stopped
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import StreamFamily, shard_of

log = logging.getLogger(__name__)

Fence = Mapping[str, int]
Starts = Mapping[str, ReadStart]
# Deliveries to route, the tokens of their shards and, of those a read brought, where it began.
Batch = tuple[list[Delivery], Fence, Starts]
NO_BATCH: Batch = ([], {}, {})

# How often a read looks behind every shard it reads, for entries pending after its position.
LOOK_BEHIND_EVERY_S = 1.0
# A read that brought this many entries makes the next one look behind too: its cost per
# event is small then, and the check left to the apply made reads so fast that batches got
# smaller (at 10,000 events/s the streams server spent 20 % more per event).
LOOK_BEHIND_AFTER_ENTRIES = 8


class ConsumeLoop:
    """Route the held shards in stream order; the one place that decides retry or move on.

    - Take-over first: a newly held shard's pending entries (left by whoever held it before,
      this router's earlier self included) are claimed page by page, in id order, and routed
      before any new entry of it is read. They are older than every entry not yet delivered,
      so each job's events are routed in stream order across holders.
    - New entries: one read over the shards being read, without waiting, checked for gaps
      (entries after this router's position pending elsewhere, or taken by a read whose reply
      was lost): a shard with a gap is taken over again, so those come first. A read looks
      behind every shard it reads after a read of `LOOK_BEHIND_AFTER_ENTRIES` entries or
      more, and at least every `LOOK_BEHIND_EVERY_S` (shards that bring nothing have gaps
      too); else the apply checks the shards it brought entries of, atomically with writing
      them: at everyday rates, one XPENDING for the shard read instead of one per shard.
      Behind a backlog the next batch is read while this one is routed; once a read has
      drained the shards, the next read blocks on the server until an entry comes, woken (not
      cancelled, which could lose its reply) by a change of held shards or stop; a source
      that cannot block waits for an append after the marks the read gave, then reads.
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
    - Acks ride on the next round trip to the streams server (the next read, or the wait
      for appends), not one of their own; they are sent on their own only before a claim
      (an entry routed but not acked would be claimed again) and at stop. A settled entry
      counts as in hand until its ack has landed, so a shard is not given up before.
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
        self._owed: list[Delivery] = []  # settled, acked with the next round trip
        # Per shard, the last entry a wait for appends saw that a read then did not bring.
        self._seen: dict[str, str] = {}
        # What wakes a blocking read: held shards changed, stop. Kept from read to read.
        self._wakers: dict[str, asyncio.Future[object]] = {}
        self.health = health or RouterHealth(clock=clock, metrics=metrics, families=source.families)
        self._runs = 0
        self._looked_behind_s = -math.inf
        self._busy = False
        self.prepared = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        if self._runs:
            # Restarted after dying: what it had in hand is pending to it, claim that first.
            self._held.take_over_again(self._held.streams())
            self._prefetch, self._drained = None, None
            self._finishing.clear()
            self._owed.clear()
        self._wakers.clear()
        self._runs += 1
        if not await self._prepare(stop):
            return
        unsettled: Sequence[Delivery] = ()
        fence: Fence = {}
        starts: Starts = {}
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
                        batch, fence, starts = await self._next_batch(stop)
                    unsettled = await self._settle(batch, fence, starts) if batch else ()
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
            for waker in self._wakers.values():
                waker.cancel()
            await self._flush_acks_at_exit()

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

    async def _next_batch(self, stop: asyncio.Event) -> Batch:
        if self._prefetch is not None:
            read, tokens = self._prefetch
            self._prefetch = None
            return await self._take_read(await read, tokens, stop)
        if stop.is_set():
            return NO_BATCH
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
            return NO_BATCH
        drained, self._drained = self._drained, None
        if drained is not None and drained[1] == tokens:
            # The last read took everything there was: wait for an append before reading.
            if self._source.can_block:
                return await self._read_blocking(tokens, stop)
            await self._wait_for_work(stop, drained[0])
            return NO_BATCH
        read = self._start_read(tokens)
        return await self._take_read(await read, tokens, stop)

    async def _read_blocking(self, tokens: dict[str, int], stop: asyncio.Event) -> Batch:
        """A read that waits on the server for the first entry, woken by a change of held
        shards or stop (and a quarantined shard's retry, by its time limit)."""
        block_ms = self._block_ms
        retry_s = self.health.next_retry_s()
        if retry_s is not None:
            block_ms = max(1, min(block_ms, int(retry_s * 1000)))
        looking_in_s = self._looked_behind_s + LOOK_BEHIND_EVERY_S - self._clock.monotonic()
        if looking_in_s > 0 and not self._busy:
            # A read that does not look behind waits only until the next one is due to.
            block_ms = max(1, min(block_ms, math.ceil(looking_in_s * 1000)))
        read = self._start_read(tokens, block_ms=block_ms)
        try:
            waits = [cast("asyncio.Future[object]", read), *self._wakers_of(stop)]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                try:
                    await self._source.interrupt()
                except (TransientError, PermanentError) as error:
                    # The read ends by itself within its block.
                    log.debug("could not wake the blocked read: %s", error)
            batch = await read
        except BaseException:
            read.cancel()
            raise
        return await self._take_read(batch, tokens, stop, blocked=True)

    def _wakers_of(self, stop: asyncio.Event) -> list[asyncio.Future[object]]:
        """Waits for a change of held shards and for stop, made again once they fired."""
        for name, event in (("changed", self._held.changed), ("stop", stop)):
            waker = self._wakers.get(name)
            if waker is None or waker.done():
                self._wakers[name] = asyncio.ensure_future(event.wait())
        return list(self._wakers.values())

    async def _claim_left(self, stream: str) -> Batch | None:
        """The next page of what earlier holders left on `stream`; None once none is left."""
        held = self._held.get(stream)
        if held is None:
            return None
        # A routed entry whose ack is still owed would be claimed and published again.
        await self._flush_acks()
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
        return page.deliveries, {stream: held.token}, {}

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

    def _start_read(self, tokens: dict[str, int], *, block_ms: int = 0) -> asyncio.Task[ReadBatch]:
        # A read in flight holds its shards: none is handed over before its entries settle.
        self._held.picked_up(tokens)
        after = {s: last for s, last in self._held.reading().items() if s in tokens}
        return asyncio.ensure_future(self._read(tokens, after, block_ms))

    async def _read(
        self, tokens: dict[str, int], after: dict[str, str], block_ms: int
    ) -> ReadBatch:
        acks = self._take_owed()
        try:
            try:
                batch = await self._source.read_new(
                    after,
                    count=self._read_count,
                    acks=acks,
                    block_ms=block_ms,
                    look_behind=self._look_behind_due(),
                )
            except BaseException:
                self._owe_again(acks)
                raise
            self._acked(acks)
            self._busy = len(batch.deliveries) >= LOOK_BEHIND_AFTER_ENTRIES
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
        self, read: ReadBatch, tokens: dict[str, int], stop: asyncio.Event, *, blocked: bool = False
    ) -> Batch:
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
            return batch.deliveries, tokens, batch.starts
        if tokens == self._reading() and not self._taking_over() and not read.broken:
            if self._source.can_block:
                # Nothing came (or the read was woken): the next read blocks again.
                self._drained = (batch.marks, tokens) if batch.marks else None
            elif not blocked:
                await self._wait_for_work(stop, self._past_seen(batch.marks))
        return NO_BATCH

    def _look_behind_due(self) -> bool:
        """Whether a read looks behind every shard it reads: after a busy read, and at least
        every `LOOK_BEHIND_EVERY_S`, for shards that bring nothing new (entries after their
        position taken by a read whose reply was lost, or by a router that read after losing
        the shard). Otherwise the apply checks the shards the read brought entries of."""
        now = self._clock.monotonic()
        if not self._busy and now - self._looked_behind_s < LOOK_BEHIND_EVERY_S:
            return False
        self._looked_behind_s = now
        return True

    def _past_seen(self, marks: Mapping[str, str]) -> dict[str, str]:
        """`marks` of a read that brought nothing, each moved past the entries the last wait
        for appends saw after it: the read did not bring them, so another consumer has them
        (a router that took the shard over while this one was paused, before it notices).
        Waiting after them again would return at once, read by read."""
        return {s: _later(self._seen.get(s), mark) for s, mark in marks.items()}

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
        starts = {s: start for s, start in read.starts.items() if s in keep}
        return ReadBatch(kept, read.gaps, read.marks, starts=starts)

    async def _wait_for_work(
        self, stop: asyncio.Event, marks: Mapping[str, str] | None = None
    ) -> None:
        """Until an entry is appended after `marks`, the held shards change, or stop; the acks
        owed go with the wait for appends, else on their own before."""
        if not marks:
            await self._flush_acks()
        acks = self._take_owed() if marks else []
        waits: list[asyncio.Future[object]] = [
            asyncio.ensure_future(self._held.changed.wait()),
            asyncio.ensure_future(stop.wait()),
        ]
        appended: asyncio.Future[dict[str, str]] | None = None
        if marks:
            appended = asyncio.ensure_future(
                self._source.wait_for_new(marks, block_ms=self._block_ms, acks=acks)
            )
            waits.append(cast("asyncio.Future[object]", appended))
        try:
            # A quarantined shard's retry wakes the loop too.
            done, _ = await asyncio.wait(
                waits, timeout=self.health.next_retry_s(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            await cancel_and_wait(waits)
            if _succeeded(appended):
                self._acked(acks)
            else:
                self._owe_again(acks)
        for wait in done:
            wait.result()  # a failed wait for appends is a transient error to back off from
        if appended is not None and appended in done:
            for stream, entry_id in appended.result().items():
                self._seen[stream] = _later(self._seen.get(stream), entry_id)

    async def _settle(
        self, batch: Sequence[Delivery], fence: Fence, starts: Starts
    ) -> list[Delivery]:
        result = await self._route(batch, fence, in_order=starts, ack=False)
        if result.error is not None:
            self.health.troubled("consumer", result.error)
        for stream in result.fenced:
            self._lost(stream)
        if result.gaps:
            # As a read's look behind would have: what comes first is routed first.
            log.warning("entries of %s were read by a router that lost them", sorted(result.gaps))
            self._held.take_over_again(result.gaps)
        self._owed += result.to_ack
        # Unsettled entries stay in hand, and so do settled ones until their ack lands.
        kept = {(d.stream, d.entry_id) for d in (*result.unsettled, *result.to_ack)}
        self._held.put_down(streams_of(d for d in batch if (d.stream, d.entry_id) not in kept))
        return result.unsettled

    def _take_owed(self) -> list[Delivery]:
        acks, self._owed = self._owed, []
        return acks

    def _owe_again(self, acks: Sequence[Delivery]) -> None:
        """`acks` may not have landed: they go with a later round trip (acking twice is
        harmless)."""
        self._owed[:0] = acks

    def _acked(self, acks: Sequence[Delivery]) -> None:
        self._held.put_down(streams_of(acks))

    async def _flush_acks(self) -> None:
        """The owed acks, in a round trip of their own."""
        acks = self._take_owed()
        if not acks:
            return
        try:
            await self._source.ack(acks)
        except PermanentError:
            # Acked, but on the shard it names, which is quarantined by the caller.
            self._acked(acks)
            raise
        except BaseException:
            self._owe_again(acks)
            raise
        self._acked(acks)

    async def _flush_acks_at_exit(self) -> None:
        owed = len(self._owed)
        try:
            await self._flush_acks()
        except Exception as error:
            # Routed and published: whoever claims them judges them applied already.
            log.warning("stopping with %d routed entries not acknowledged: %s", owed, error)

    def _lost(self, stream: str) -> None:
        self._seen.pop(stream, None)
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
        await cancel_and_wait([read])

    async def _pause(self, stop: asyncio.Event, stop_deadline: float | None) -> None:
        delay = self._backoff.next_delay()
        if stop_deadline is None:
            await sleep_unless_stopped(stop, delay)
        else:
            await asyncio.sleep(max(0.0, min(delay, stop_deadline - time.monotonic())))


def _succeeded(future: asyncio.Future[dict[str, str]] | None) -> bool:
    return (
        future is not None and future.done() and not future.cancelled() and not future.exception()
    )


def _later(first: str | None, second: str) -> str:
    if first is None or StreamEntryId.parse(second) > StreamEntryId.parse(first):
        return second
    return first
