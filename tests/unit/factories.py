"""Test data and a fully wired in-memory router, for the unit tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.adapters.memory.broadcaster import InMemoryBroadcaster
from eco_router.adapters.memory.clock import ManualClock
from eco_router.adapters.memory.dead_letters import InMemoryDeadLetterSink
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.leases import InMemoryLeaseStore, LeaseTable
from eco_router.adapters.memory.metrics import InMemoryRouterMetrics
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup, PendingEntry
from eco_router.application.backoff import Backoff
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.held_shards import HeldShards, Phase
from eco_router.application.keep_leases import KeepLeases
from eco_router.application.observe_shards import ObserveShards
from eco_router.application.port_values import Delivery
from eco_router.application.reclaim_pending import ReclaimPending
from eco_router.application.route_batch import RouteBatch, RouteResult
from eco_router.application.router_service import RouterService
from eco_router.domain.event import JobEvent
from eco_router.domain.streams import StreamFamily

T = TypeVar("T")

FAMILY = StreamFamily("scan:events", 4)
GROUP = "router"
CHANNEL_PREFIX = "sse:events"
START_MS = 1_700_000_000_000
LEASE_TTL_MS = 4000


def make_fields(**overrides: str | bytes | int | None) -> dict[bytes, bytes]:
    """A valid entry's fields; an override of None drops the field."""
    values: dict[str, str | bytes | int | None] = {
        "job_id": "job-1",
        "seq": "1",
        "stage": "scan",
        "status": "running",
        "ts": "2024-05-01T12:00:00Z",
        "progress": "10",
    }
    values.update(overrides)
    return {name.encode(): _bytes(value) for name, value in values.items() if value is not None}


def make_event(**overrides: Any) -> JobEvent:
    """A valid `JobEvent` of job-1 in the `scan` domain."""
    job_id = overrides.get("job_id", "job-1")
    values: dict[str, Any] = {
        "domain": "scan",
        "stream": FAMILY.stream_for(job_id),
        "stream_id": f"{START_MS}-0",
        "job_id": job_id,
        "seq": 1,
    }
    values.update(overrides)
    return JobEvent(**values)


@dataclass(frozen=True, slots=True)
class FencedRoute:
    """A `RouteBatch` called under fixed fencing tokens, as a holder of those shards calls it."""

    route: RouteBatch
    fence: Mapping[str, int]

    async def __call__(self, deliveries: list[Delivery]) -> RouteResult:
        return await self.route(deliveries, self.fence)


@dataclass
class Harness:
    """In-memory streams, adapters and use cases for the `scan:events` family (4 shards).

    The harness's consumer starts out holding every shard under fencing token 1.
    """

    max_deliveries: int = 3
    consumer: str = "router-1"
    max_field_bytes: int = 64 * 1024
    clock: ManualClock = field(default_factory=lambda: ManualClock(START_MS))
    family: StreamFamily = FAMILY
    streams: InMemoryStreams = field(init=False)
    source: InMemoryEventSource = field(init=False)
    store: InMemoryStateStore = field(init=False)
    broadcaster: InMemoryBroadcaster = field(init=False)
    dead_letters: InMemoryDeadLetterSink = field(init=False)
    metrics: InMemoryRouterMetrics = field(init=False)
    encoder: OrjsonEventEncoder = field(init=False)
    leases: LeaseTable = field(init=False)
    fence: dict[str, int] = field(init=False)
    read_from: dict[str, str] = field(init=False)
    route: FencedRoute = field(init=False)

    def __post_init__(self) -> None:
        self.streams = InMemoryStreams(self.clock)
        self.leases = self.streams.lease_table(GROUP)
        self.fence = {stream: 1 for stream in self.family.streams}
        self.read_from = dict.fromkeys(self.family.streams, "0-0")
        self.leases.epochs.update(self.fence)
        self.store = InMemoryStateStore(
            clock=self.clock,
            streams=self.streams,
            group=GROUP,
            state_ttl_s=3600,
            markers_ttl_s=7200,
            history_size=100,
        )
        self.broadcaster = InMemoryBroadcaster(channel_prefix=CHANNEL_PREFIX)
        self.dead_letters = InMemoryDeadLetterSink(self.streams)
        self.metrics = InMemoryRouterMetrics()
        self.encoder = OrjsonEventEncoder()
        self.source = self.consumer_source(self.consumer)
        self.route = self.route_for(self.source)

    # --- wiring more consumers and use cases on the same streams ---

    def consumer_source(self, consumer: str) -> InMemoryEventSource:
        """Another consumer of the same group on the same streams (another process)."""
        return InMemoryEventSource(
            self.streams, families=[self.family], group=GROUP, consumer=consumer
        )

    def route_for(self, source: InMemoryEventSource) -> FencedRoute:
        """Routing by `source`'s consumer under the harness's fencing tokens."""
        return FencedRoute(self.route_batch(source), self.fence)

    def route_batch(self, source: InMemoryEventSource) -> RouteBatch:
        return RouteBatch(
            source=source,
            store=self.store,
            broadcaster=self.broadcaster,
            dead_letters=self.dead_letters,
            encoder=self.encoder,
            metrics=self.metrics,
            clock=self.clock,
            max_deliveries=self.max_deliveries,
            max_field_bytes=self.max_field_bytes,
        )

    def held_shards(self, phase: Phase = Phase.READING) -> HeldShards:
        """Every shard held under the harness's fencing tokens, in `phase`."""
        held = HeldShards()
        for stream, token in self.fence.items():
            held.gain(stream, token, since_ms=self.clock.now_ms(), now_s=self.clock.monotonic())
            if phase is Phase.READING:
                held.took_over(stream)
        return held

    def lease_store(self) -> InMemoryLeaseStore:
        return InMemoryLeaseStore(self.leases, ttl_ms=LEASE_TTL_MS)

    def lease_keeper(
        self, router: str, held: HeldShards, leases: InMemoryLeaseStore | None = None
    ) -> KeepLeases:
        """`router`'s lease keeper on the harness's table, through its own store by default."""
        return KeepLeases(
            leases=leases or self.lease_store(),
            held=held,
            router=router,
            families=[self.family],
            metrics=self.metrics,
            clock=self.clock,
            renew_s=0.001,
        )

    def reclaimer(
        self,
        source: InMemoryEventSource,
        *,
        min_idle_ms: int = 30_000,
        page_size: int = 100,
        held: HeldShards | None = None,
    ) -> ReclaimPending:
        return ReclaimPending(
            source=source,
            broadcaster=self.broadcaster,
            route=self.route_batch(source),
            held=held or self.held_shards(),
            metrics=self.metrics,
            clock=self.clock,
            min_idle_ms=min_idle_ms,
            page_size=page_size,
            backoff=Backoff(initial_s=0.001, max_s=0.01),
        )

    def consume_loop(
        self,
        source: InMemoryEventSource | None = None,
        *,
        read_count: int = 10,
        drain_grace_s: float = 2.0,
        held: HeldShards | None = None,
        block_ms: int = 5,
    ) -> ConsumeLoop:
        """A consumer that has just taken every shard (it takes over before reading)."""
        source = source or self.source
        return ConsumeLoop(
            source=source,
            route=self.route_batch(source),
            held=held or self.held_shards(Phase.TAKING_OVER),
            metrics=self.metrics,
            clock=self.clock,
            read_count=read_count,
            block_ms=block_ms,
            backoff=Backoff(initial_s=0.001, max_s=0.01),
            drain_grace_s=drain_grace_s,
        )

    def router_service(self, consumer: str | None = None) -> RouterService:
        """A whole router (lease keeper, consumer, reclaimer, observer) of `consumer`."""
        source = self.consumer_source(consumer) if consumer else self.source
        held = HeldShards()
        return RouterService(
            leases=self.lease_keeper(consumer or self.consumer, held),
            consume=self.consume_loop(source, held=held),
            reclaim=self.reclaimer(source, held=held),
            observe=ObserveShards(source=source, metrics=self.metrics),
            reclaim_interval_s=0.01,
            observe_interval_s=0.01,
        )

    # --- producing ---

    def xadd(self, job_id: str, seq: int | str, **fields: str | bytes | int | None) -> str:
        """Append an event of `job_id` to its md5 shard, as a producer does; returns the id."""
        return self.streams.xadd(
            self.family.stream_for(job_id), make_fields(job_id=job_id, seq=seq, **fields)
        )

    def xadd_raw(self, stream: str, fields: Mapping[bytes, bytes]) -> str:
        return self.streams.xadd(stream, fields)

    # --- reading ---

    async def read(
        self, count: int = 100, source: InMemoryEventSource | None = None
    ) -> list[Delivery]:
        """One read of new entries by this harness's consumer (or `source`'s)."""
        return (await (source or self.source).read_new(self.read_from, count=count)).deliveries

    async def redeliver(self, source: InMemoryEventSource | None = None) -> list[Delivery]:
        """Every pending entry claimed again by `source` (the harness's consumer by default),
        counting the delivery, as a take-over does."""
        source = source or self.source
        found: list[Delivery] = []
        for stream, token in self.fence.items():
            page = await source.claim(stream, token=token, cursor="0-0", min_idle_ms=0, count=1000)
            found += page.deliveries
        return found

    def published(self, job_id: str) -> list[dict[str, Any]]:
        channel = self.broadcaster.channel(job_id)
        return [orjson.loads(payload) for name, payload in self.broadcaster.sent if name == channel]

    def published_seqs(self, job_id: str) -> list[int]:
        return [payload["seq"] for payload in self.published(job_id)]

    def pending(self) -> dict[str, PendingEntry]:
        """The group's pending entries on every shard, by entry id."""
        found: dict[str, PendingEntry] = {}
        for stream in self.family.streams:
            found.update(self.streams.pending(stream, GROUP))
        return found

    def groups_ready(self) -> bool:
        """True once the group exists on every shard."""
        try:
            self.pending()
        except NoGroup:
            return False
        return True

    def dead_lettered(self) -> list[dict[bytes, bytes]]:
        return [fields for _, fields in self.streams.entries(self.family.dead_letter_stream)]

    async def state(self, job_id: str) -> dict[str, Any] | None:
        view = await self.store.view(self.family.domain, job_id)
        return None if view.state is None else orjson.loads(view.state)

    async def history_seqs(self, job_id: str) -> list[int]:
        view = await self.store.view(self.family.domain, job_id)
        return [orjson.loads(payload)["seq"] for payload in view.history]


async def eventually(
    probe: Callable[[], T | Awaitable[T]], *, timeout_s: float = 5.0, every_s: float = 0.002
) -> T:
    """The first truthy value `probe` gives; AssertionError if none comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s (last value {value!r})")
        await asyncio.sleep(every_s)


def _bytes(value: str | bytes | int) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()
