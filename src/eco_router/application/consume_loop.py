"""The consumer: carries out the read plan on the shards this router holds, batch after batch."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eco_router.application.backoff import Backoff
from eco_router.application.errors import PermanentError, TransientError
from eco_router.application.held_shards import HeldShards, Phase, streams_of
from eco_router.application.owed_acks import OwedAcks
from eco_router.application.port_values import Delivery, ReadBatch, ReadStart
from eco_router.application.ports import Clock, EventSource, RouterMetrics
from eco_router.application.route_batch import RouteBatch
from eco_router.application.router_health import RouterHealth
from eco_router.application.stopping import cancel_and_wait, sleep_unless_stopped
from eco_router.application.take_overs import TakeOvers
from eco_router.domain.read_plan import (
    BackOff,
    Claim,
    Drained,
    FlushAcks,
    Probe,
    Read,
    ReadResult,
    RouteAgain,
    Situation,
    Step,
    Stop,
    TakePrefetched,
    Wait,
    after_read,
    busy,
    next_step,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Batch:
    """Deliveries to route, the tokens of their shards and, of those a read brought, where
    it began."""

    deliveries: Sequence[Delivery] = ()
    fence: Mapping[str, int] = field(default_factory=dict)
    starts: Mapping[str, ReadStart] = field(default_factory=dict)


NO_BATCH = Batch()


class ConsumeLoop:
    """Route the held shards in stream order; the one place that decides retry or move on.

    What comes next is the read plan's (`domain/read_plan.py`: take-over first, reads, blocks
    and waits, look-behind, back-off, drain on stop); this carries its steps out:
    - A read or claim brings a batch, routed at once; a read starts the next one meanwhile
      when the plan says so. A read in flight holds its shards (none is handed over before
      its entries settle); a blocking one is woken (not cancelled, which could lose its
      reply) by a change of held shards or stop.
    - Gaps (entries after this router's position pending elsewhere, or taken by a read whose
      reply was lost), found by a read's look-behind or by the apply: the shard is taken over
      again, so those come first. So is every shard of a read that failed.
    - A fenced shard (another router holds it now) is dropped with what is in hand of it,
      unacked: its new holder claims those entries.
    - Transient errors: the batch is kept in memory and routed again after a back-off.
    - A shard the server refuses for good is quarantined (`RouterHealth`), probed when due;
      a group that vanished is created again at this router's position on the shard.
    - Any other error: log it and leave the batch pending for the reclaimer, which brings it
      back with its delivery count, so a poison entry ends in the dead-letter stream.
    - Acks ride on the next read (`OwedAcks`); alone only when the plan flushes them, and at
      stop. A settled entry counts as in hand until its ack has landed, so a shard is not
      given up before.
    - Stop: the batch in flight is finished within `drain_grace_s`, the rest stays pending.
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
        self._clock = clock
        self._read_count = read_count
        self._block_ms = block_ms
        self._backoff = backoff or Backoff()
        self._drain_grace_s = drain_grace_s
        self._family_of = {s: f for f in source.families for s in f.streams}
        self.health = health or RouterHealth(clock=clock, metrics=metrics, families=source.families)
        self.prepared = asyncio.Event()
        self._acks = OwedAcks(source=source, held=held)
        self._take_overs = TakeOvers(
            source=source,
            held=held,
            health=self.health,
            metrics=metrics,
            clock=clock,
            page_size=read_count,
        )
        self._runs = 0
        self._reset()

    def _reset(self) -> None:
        self._unsettled = NO_BATCH
        self._failed = False
        self._deadline: float | None = None
        self._prefetch: tuple[asyncio.Task[ReadBatch], Mapping[str, int]] | None = None
        self._drained: Drained | None = None
        self._take_overs.abandon()
        # What wakes a blocking read: held shards changed, stop. Kept from read to read.
        self._wakers: dict[str, asyncio.Future[object]] = {}
        # Wakes of a blocking read under way (CLIENT UNBLOCK from another connection).
        self._waking: set[asyncio.Future[None]] = set()
        self._looked_behind_s = -math.inf
        self._busy = False
        self._acks.forget()

    async def run(self, stop: asyncio.Event) -> None:
        if self._runs:
            # Restarted after dying: what it had in hand is pending to it, claim that first.
            self._held.take_over_again(self._held.streams())
        self._reset()
        self._runs += 1
        if not await self._prepare(stop):
            return
        try:
            while True:
                if stop.is_set() and self._deadline is None:
                    self._deadline = time.monotonic() + self._drain_grace_s
                # Cleared before looking, so a shard gained while a step awaits wakes a wait.
                self._held.changed.clear()
                # A shard given up while it was being tried is no longer this router's to judge.
                self.health.worked(s for s in self.health.probing() if not self._routing(s))
                step = next_step(self._situation(stop))
                if isinstance(step, Stop):
                    if step.abandon:
                        n = len(self._unsettled.deliveries)
                        log.warning("stopping with %d entries left pending", n)
                    return
                if isinstance(step, BackOff):
                    await self._pause(stop)
                    self._failed = False
                    continue
                await self._attempt(step, stop)
        finally:
            if self._prefetch is not None:
                await cancel_and_wait([self._prefetch[0]])
                self._prefetch = None
            for waker in self._wakers.values():
                waker.cancel()
            await cancel_and_wait(list(self._waking))
            await self._flush_acks_at_exit()

    def _situation(self, stop: asyncio.Event) -> Situation:
        return Situation(
            shards=self._held.shards(self.health.blocked()),
            now=self._clock.monotonic(),
            block_ms=self._block_ms,
            looked_behind_s=self._looked_behind_s,
            busy=self._busy,
            stopping=stop.is_set(),
            past_grace=self._deadline is not None and time.monotonic() >= self._deadline,
            backing_off=self._failed,
            retrying=bool(self._unsettled.deliveries),
            prefetched=self._prefetch is not None,
            owed_acks=len(self._acks),
            drained=self._drained,
            probes_due=tuple(self.health.due()),
            retry_in_s=self.health.next_retry_s(),
        )

    async def _attempt(self, step: Step, stop: asyncio.Event) -> None:
        batch = self._unsettled
        self._failed = False
        try:
            if not isinstance(step, RouteAgain):
                batch = await self._carry_out(step, stop)
            unsettled = await self._settle(batch) if batch.deliveries else ()
            self._unsettled = Batch(unsettled, batch.fence, batch.starts)
            self._failed = bool(unsettled)
            if not unsettled:
                self._take_overs.finish()
        except TransientError as error:
            self.health.troubled("consumer", error)
            self._unsettled, self._failed = batch, True
        except PermanentError as error:
            self._held.put_down(streams_of(batch.deliveries))
            self._unsettled = NO_BATCH
            if error.key in self._family_of:
                # Refused for good on one shard (its ack): the rest of the batch settled.
                self.health.quarantine(error.key, error)
                self._take_overs.abandon(error.key)
            else:
                # A job's key, say: poison for the reclaimer, like any other error.
                log.error("routing refused, the batch stays pending: %s", error)
                self._take_overs.abandon()
                self._failed = True
        except Exception:
            log.exception("routing failed; the batch stays pending for the reclaimer")
            self._held.put_down(streams_of(batch.deliveries))
            self._take_overs.abandon()
            self._unsettled, self._failed = NO_BATCH, True
        if not self._failed:
            self._backoff.reset()
            self.health.untroubled("consumer")

    async def _carry_out(self, step: Step, stop: asyncio.Event) -> Batch:
        """The batch `step` brings (none for those that bring nothing)."""
        if isinstance(step, TakePrefetched) and self._prefetch is not None:
            read, tokens = self._prefetch
            self._prefetch = None
            return self._take_read(await read, tokens, stop)
        if isinstance(step, Probe):
            await self._probe(step.streams)
        elif isinstance(step, FlushAcks):
            await self._acks.flush()
        elif isinstance(step, Claim):
            deliveries, token = await self._take_overs.claim(step.stream)
            return Batch(deliveries, {step.stream: token}) if deliveries else NO_BATCH
        elif isinstance(step, Read):
            self._drained = None
            if step.block_ms:
                return await self._read_blocking(step, stop)
            return self._take_read(
                await self._read(step, self._begin_read(step)), step.tokens, stop
            )
        elif isinstance(step, Wait):
            await self._wait_for_work(stop)
        return NO_BATCH

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

    async def _probe(self, streams: Sequence[str]) -> None:
        """Once the group can be created, a held shard is taken over again (its claim and
        reads tell whether it works); one held elsewhere works as far as this router can tell."""
        for stream in streams:
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

    async def _read_blocking(self, step: Read, stop: asyncio.Event) -> Batch:
        """A read that waits on the server for the first entry, woken by a change of held
        shards or stop. It runs in this task, not one of its own: a waker that fires while it
        is in flight starts the wake (which the read answers by returning what it has)."""
        wakers = self._wakers_of(stop)
        for waker in wakers:
            waker.add_done_callback(self._wake_read)
        try:
            batch = await self._read(step, self._begin_read(step))
        finally:
            for waker in wakers:
                waker.remove_done_callback(self._wake_read)
        return self._take_read(batch, step.tokens, stop)

    def _wake_read(self, _: object) -> None:
        wake = asyncio.ensure_future(self._interrupt())
        self._waking.add(wake)
        wake.add_done_callback(self._waking.discard)

    async def _interrupt(self) -> None:
        try:
            await self._source.interrupt()
        except (TransientError, PermanentError) as error:
            # The read ends by itself within its block.
            log.debug("could not wake the blocked read: %s", error)

    def _wakers_of(self, stop: asyncio.Event) -> list[asyncio.Future[object]]:
        """Waits for a change of held shards and for stop, made again once they fired."""
        for name, event in (("changed", self._held.changed), ("stop", stop)):
            waker = self._wakers.get(name)
            if waker is None or waker.done():
                self._wakers[name] = asyncio.ensure_future(event.wait())
        return list(self._wakers.values())

    def _start_read(self, step: Read) -> asyncio.Task[ReadBatch]:
        """A read running beside this task (a prefetch, overlapping the routing of a batch)."""
        return asyncio.ensure_future(self._read(step, self._begin_read(step)))

    def _begin_read(self, step: Read) -> dict[str, str]:
        """Where the read of `step` starts on each shard, once it holds them."""
        # A read in flight holds its shards: none is handed over before its entries settle.
        self._held.picked_up(step.tokens)
        if step.look_behind:
            self._looked_behind_s = self._clock.monotonic()
        return {s: last for s, last in self._held.reading().items() if s in step.tokens}

    async def _read(self, step: Read, after: dict[str, str]) -> ReadBatch:
        tokens = step.tokens
        acks = self._acks.take()
        try:
            try:
                batch = await self._source.read_new(
                    after,
                    count=self._read_count,
                    acks=acks,
                    block_ms=step.block_ms,
                    look_behind=step.look_behind,
                )
            except BaseException:
                self._acks.owe_again(acks)
                raise
            self._acks.landed(acks)
            self._busy = busy(len(batch.deliveries))
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

    def _take_read(self, read: ReadBatch, tokens: Mapping[str, int], stop: asyncio.Event) -> Batch:
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
        self._retake(read.gaps)
        batch = self._still_reading(read, tokens)
        result = ReadResult(tokens, len(batch.deliveries), bool(batch.marks), bool(read.broken))
        follow = after_read(self._situation(stop), result)
        self._drained = follow.drained
        if follow.prefetch is not None:
            self._prefetch = (self._start_read(follow.prefetch), follow.prefetch.tokens)
        return Batch(batch.deliveries, tokens, batch.starts) if batch.deliveries else NO_BATCH

    def _retake(self, gaps: frozenset[str]) -> None:
        if gaps:
            # A router that lost these shards read entries of them after this one's last:
            # take the shards over again, so those come first, then what was just read.
            log.warning("entries of %s were read by a router that lost them", sorted(gaps))
            self._held.take_over_again(gaps)

    def _still_reading(self, read: ReadBatch, tokens: Mapping[str, int]) -> ReadBatch:
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

    async def _wait_for_work(self, stop: asyncio.Event) -> None:
        """Until the held shards change, stop, or a quarantined shard's retry is due."""
        waits = [
            asyncio.ensure_future(self._held.changed.wait()),
            asyncio.ensure_future(stop.wait()),
        ]
        try:
            await asyncio.wait(
                waits, timeout=self.health.next_retry_s(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            await cancel_and_wait(waits)

    async def _settle(self, batch: Batch) -> list[Delivery]:
        result = await self._route(batch.deliveries, batch.fence, in_order=batch.starts, ack=False)
        if result.error is not None:
            self.health.troubled("consumer", result.error)
        for stream in result.fenced:
            self._take_overs.lost(stream)
        self._retake(result.gaps)  # as a read's look behind would have
        self._acks.owe(result.to_ack)
        # Unsettled entries stay in hand, and so do settled ones until their ack lands.
        kept = {(d.stream, d.entry_id) for d in (*result.unsettled, *result.to_ack)}
        self._held.put_down(
            streams_of(d for d in batch.deliveries if (d.stream, d.entry_id) not in kept)
        )
        return result.unsettled

    async def _flush_acks_at_exit(self) -> None:
        owed = len(self._acks)
        try:
            await self._acks.flush()
        except Exception as error:
            # Routed and published: whoever claims them judges them applied already.
            log.warning("stopping with %d routed entries not acknowledged: %s", owed, error)

    async def _pause(self, stop: asyncio.Event) -> None:
        delay = self._backoff.next_delay()
        if self._deadline is None:
            await sleep_unless_stopped(stop, delay)
        else:
            await asyncio.sleep(max(0.0, min(delay, self._deadline - time.monotonic())))
