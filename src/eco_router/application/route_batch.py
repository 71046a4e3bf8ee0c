"""Use case: route one batch of deliveries."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eco_router.application.errors import BroadcastFailed
from eco_router.application.port_values import (
    Applied,
    DeadLetter,
    Delivery,
    EncodedEvent,
    ReadStart,
)
from eco_router.application.ports import (
    Broadcaster,
    Clock,
    DeadLetterSink,
    EventEncoder,
    EventSource,
    RouterMetrics,
    StateStore,
)
from eco_router.domain.event import JobEvent
from eco_router.domain.event_size import DEFAULT_SIZE_LIMITS, EventSizeLimits
from eco_router.domain.parsing import DEFAULT_MAX_FIELD_BYTES, parse_entry
from eco_router.domain.rejection import Rejection, RejectReason
from eco_router.domain.streams import shard_of
from eco_router.domain.text import stamped
from eco_router.domain.verdict import Judgement, Verdict, in_judging_order

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RouteResult:
    """What became of a batch; `unsettled` deliveries are owed a publish and were not acked;
    `to_ack` are the settled ones left for the caller to ack (when it asked to)."""

    verdicts: Counter[Verdict] = field(default_factory=Counter)
    unsettled: list[Delivery] = field(default_factory=list)
    to_ack: list[Delivery] = field(default_factory=list)
    fenced: frozenset[str] = frozenset()
    gaps: frozenset[str] = frozenset()
    error: BroadcastFailed | None = None


class RouteBatch:
    """Route a batch: judge, apply, publish, dead-letter, acknowledge.

    - Entries deleted before they were acked are acked and counted; nothing else can be done.
    - Each dead letter is logged at warning with its entry id and reason, once it is stored.
    - An entry delivered more than `max_deliveries` times is dead-lettered unread (poison).
    - An entry that does not parse is INVALID and dead-lettered with its reason; so is one
      whose routed JSON is above its size limit (`too_large`), measured on the payload the
      encoder made anyway.
    - Each job's events are judged in seq order, the whole batch in one atomic store call.
    - NEW events are published in that order; DUPLICATE and STALE ones are only acked.
    - A token written after its job's end is STALE (the end ends the text); the first one
      of a job is logged at warning, the later ones only counted.
    - Publish-then-ack: when the publish fails, the NEW entries stay unacked and are returned
      as unsettled, so a retry (or another consumer) publishes them; everything else is acked,
      or, with `ack=False`, returned as `to_ack` for the caller to ack in its next round trip.
    - Fencing: the batch is applied only for the shards whose token in `fence` still holds
      (checked atomically with the apply). A fenced shard's entries are left as they are,
      unpublished, not dead-lettered and unacked: the router that holds it now routes them.
    - Order: the shards of `in_order` (a read's starts) are applied only if nothing pending
      comes between where their read began and its first entry (checked with the apply);
      a shard with such a gap is left as a fenced one is, for the caller to take over again.
    """

    def __init__(
        self,
        *,
        source: EventSource,
        store: StateStore,
        broadcaster: Broadcaster,
        dead_letters: DeadLetterSink,
        encoder: EventEncoder,
        metrics: RouterMetrics,
        clock: Clock,
        max_deliveries: int,
        max_field_bytes: int = DEFAULT_MAX_FIELD_BYTES,
        size_limits: EventSizeLimits = DEFAULT_SIZE_LIMITS,
    ) -> None:
        self._source = source
        self._store = store
        self._broadcaster = broadcaster
        self._dead_letters = dead_letters
        self._encoder = encoder
        self._metrics = metrics
        self._clock = clock
        self._max_deliveries = max_deliveries
        self._max_field_bytes = max_field_bytes
        self._size_limits = size_limits

    async def __call__(
        self,
        deliveries: Sequence[Delivery],
        fence: Mapping[str, int],
        *,
        in_order: Mapping[str, ReadStart] | None = None,
        ack: bool = True,
    ) -> RouteResult:
        started = self._clock.monotonic()
        result = RouteResult()
        letters: list[DeadLetter] = []
        events: list[JobEvent] = []
        by_entry: dict[tuple[str, str], Delivery] = {}
        for delivery in deliveries:
            outcome = self._triage(delivery)
            if isinstance(outcome, JobEvent):
                events.append(outcome)
                by_entry[(delivery.stream, delivery.entry_id)] = delivery
            elif outcome is not None:
                letters.append(DeadLetter(delivery, outcome.reason, outcome.detail))

        encoded: list[EncodedEvent] = []
        for event in in_judging_order(events):
            try:
                payload = self._encoder.encode(event)
            except (TypeError, ValueError) as error:
                # A result the encoder cannot write (a 2**64 integer) must not hold up the batch.
                delivery = by_entry.pop(_entry_key(event))
                letters.append(
                    DeadLetter(delivery, RejectReason.RESULT_NOT_JSON, f"cannot encode: {error}")
                )
                continue
            # Most events are under the smaller limit: only the others are judged further.
            too_large = (
                self._size_limits.check(
                    len(payload),
                    stage=event.stage,
                    status=event.status,
                    has_result=event.has_result,
                )
                if len(payload) > self._size_limits.max_event_bytes
                else None
            )
            if too_large is not None:
                delivery = by_entry.pop(_entry_key(event))
                letters.append(DeadLetter(delivery, too_large.reason, too_large.detail))
                continue
            encoded.append(EncodedEvent(event, payload))
        # A batch routed again holds a part of its read: only those shards are checked.
        read = {d.stream for d in deliveries}
        starts = {s: start for s, start in (in_order or {}).items() if s in read}
        applied = await self._apply(encoded, letters, fence, starts)
        result.fenced, result.gaps = applied.fenced, applied.gaps
        left = applied.fenced | applied.gaps
        if left:
            letters = [x for x in letters if x.delivery.stream not in left]
            deliveries = [d for d in deliveries if d.stream not in left]
        judged: list[tuple[EncodedEvent, Judgement]] = []
        # What is published carries the fields the store gave it (its event id...).
        to_broadcast: list[EncodedEvent] = []
        for n, (item, judgement) in enumerate(zip(encoded, applied.judgements, strict=True)):
            if judgement is None:
                continue
            judged.append((item, judgement))
            if judgement.publish:
                fields = applied.stamp_of(n)
                to_broadcast.append(
                    EncodedEvent(item.event, stamped(item.payload, fields)) if fields else item
                )
            if judgement.fills:
                log.warning(
                    "the text of %s job %s is full (EVENT_ROUTER_TEXT_MAX_BYTES): its later "
                    "tokens are not routed and its end marks the text truncated",
                    item.event.domain,
                    item.event.job_id,
                )
            if judgement.first_after_end:
                log.warning(
                    "a token of %s job %s was written after its end (done or failed): it and "
                    "the job's later tokens are not routed",
                    item.event.domain,
                    item.event.job_id,
                )
        try:
            if to_broadcast:
                await self._broadcaster.broadcast(to_broadcast)
        except BroadcastFailed as error:
            self._metrics.broadcast_failed(len(to_broadcast))
            # The caller warns once per episode of failures, not once per batch.
            log.debug(
                "broadcast of %d events failed, keeping them unacked: %s", len(to_broadcast), error
            )
            result.error = error
            result.unsettled = [by_entry[_entry_key(item.event)] for item in to_broadcast]
        else:
            self._report_published(to_broadcast)

        if letters:
            await self._dead_letters.send(letters)
            for letter in letters:
                log.warning(
                    "dead-lettered %s %s: %s (%r)",
                    letter.delivery.stream,
                    letter.delivery.entry_id,
                    letter.reason.value,
                    letter.detail,
                )
        if result.unsettled:
            unsettled = {(d.stream, d.entry_id) for d in result.unsettled}
            settled = [d for d in deliveries if (d.stream, d.entry_id) not in unsettled]
        else:
            settled = list(deliveries)
        if ack:
            await self._source.ack(settled)
        else:
            result.to_ack = settled

        self._report(result, letters, judged, deliveries, started)
        return result

    async def _apply(
        self,
        encoded: Sequence[EncodedEvent],
        letters: Sequence[DeadLetter],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart],
    ) -> Applied:
        # Every shard with something to write is fenced, dead letters included, so a router
        # that lost a shard neither applies nor dead-letters what the new holder routes.
        writing = {item.event.stream for item in encoded}
        writing.update(letter.delivery.stream for letter in letters)
        # A read's shards are checked even with nothing to write (deleted entries only): an
        # entry left before them must come first.
        writing.update(in_order)
        unheld = frozenset(s for s in writing if s not in fence)
        if not unheld:
            # Every shard written is held (the everyday batch): the store's answer as it is.
            return await self._store.apply(encoded, {s: fence[s] for s in writing}, in_order)
        if not writing - unheld:
            return Applied([None] * len(encoded), unheld)
        held = [item for item in encoded if item.event.stream not in unheld]
        applied = await self._store.apply(held, {s: fence[s] for s in writing - unheld}, in_order)
        judgements = iter(applied.judgements)
        stamps = iter(applied.stamp_of(n) for n in range(len(held)))
        return Applied(
            [None if item.event.stream in unheld else next(judgements) for item in encoded],
            applied.fenced | unheld,
            applied.gaps,
            [None if item.event.stream in unheld else next(stamps) for item in encoded],
        )

    def _triage(self, delivery: Delivery) -> JobEvent | Rejection | None:
        if delivery.fields is None:
            return None
        if delivery.delivery_count > self._max_deliveries:
            return Rejection(
                RejectReason.MAX_DELIVERIES,
                f"delivered {delivery.delivery_count} times (max {self._max_deliveries})",
            )
        return parse_entry(
            domain=delivery.family.domain,
            stream=delivery.stream,
            entry_id=delivery.entry_id,
            fields=delivery.fields,
            max_field_bytes=self._max_field_bytes,
        )

    def _report_published(self, published: Sequence[EncodedEvent]) -> None:
        now_ms = self._clock.now_ms()
        latencies: dict[str, list[float]] = {}
        for item in published:
            event = item.event
            written_ms = int(event.stream_id.partition("-")[0])
            values = latencies.get(event.domain)
            if values is None:
                values = latencies[event.domain] = []
            values.append(float(max(0, now_ms - written_ms)))
        for domain, values in latencies.items():
            self._metrics.events_published(domain, values)

    def _report(
        self,
        result: RouteResult,
        letters: Sequence[DeadLetter],
        judged: Sequence[tuple[EncodedEvent, Judgement]],
        deliveries: Sequence[Delivery],
        started: float,
    ) -> None:
        # Plain dicts: a Counter built per batch costs more than the few additions it holds.
        per_domain: dict[tuple[str, Verdict], int] = {}
        for item, judgement in judged:
            key = (item.event.domain, judgement.verdict)
            per_domain[key] = per_domain.get(key, 0) + 1
        if letters:
            dead: Counter[tuple[str, RejectReason]] = Counter()
            for letter in letters:
                dead[(letter.delivery.family.domain, letter.reason)] += 1
                if letter.reason is not RejectReason.MAX_DELIVERIES:
                    key = (letter.delivery.family.domain, Verdict.INVALID)
                    per_domain[key] = per_domain.get(key, 0) + 1
            for (domain, reason), count in dead.items():
                self._metrics.dead_lettered(domain, reason, count)
        for (domain, verdict), count in per_domain.items():
            self._metrics.events_judged(domain, verdict, count)
            result.verdicts[verdict] += count
        if any(d.gone for d in deliveries):
            gone: Counter[tuple[str, int]] = Counter(
                (d.family.domain, shard_of(d.stream)) for d in deliveries if d.gone
            )
            for (domain, shard), count in gone.items():
                self._metrics.trimmed_before_ack(domain, shard, count)
        self._metrics.batch_routed(size=len(deliveries), seconds=self._clock.monotonic() - started)


def _entry_key(event: JobEvent) -> tuple[str, str]:
    return (event.stream, event.stream_id)
