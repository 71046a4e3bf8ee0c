"""What the operator console shows of the pipeline: routers, shards, rates, dead letters."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from eco_router.application.port_values import ShardCounters
from eco_router.application.ports import DeadLetterArchive, EventSource, LeaseStore, ShardProgress
from eco_router.domain.streams import StreamFamily

Number = TypeVar("Number", int, float)


@dataclass(frozen=True, slots=True)
class ShardRow:
    """One shard: its lease (holder, since, fencing token), the group's backlog and rates."""

    stream: str
    shard: int
    holder: str | None
    token: int | None
    since_ms: int | None
    lease_expires_in_ms: int | None
    lag: int | None
    pending: int
    added_per_s: float | None
    read_per_s: float | None


@dataclass(frozen=True, slots=True)
class DomainRow:
    """One stream family: its shards, their totals and its dead letters."""

    domain: str
    prefix: str
    lag: int | None
    pending: int
    added_per_s: float | None
    read_per_s: float | None
    dead_letters: int
    newest_dead_letter: str | None
    shards: tuple[ShardRow, ...]


@dataclass(frozen=True, slots=True)
class RouterRow:
    """A live router and the shards it holds."""

    name: str
    lease_expires_in_ms: int
    shards: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConsoleSnapshot:
    """The whole pipeline at `now_ms` (the lease store's clock)."""

    group: str
    now_ms: int
    rate_window_ms: int
    routers: tuple[RouterRow, ...]
    domains: tuple[DomainRow, ...]


@dataclass(frozen=True, slots=True)
class _Sample:
    at_ms: int
    counters: Mapping[str, ShardCounters]


class ReadConsoleSnapshot:
    """Reads the pipeline for the console from the ports the router already keeps.

    - Every shard of every configured family is listed, held or not; a router is listed while
      its heartbeat lives, with the shards whose live lease it holds.
    - Rates are derived here, from the shards' ever-growing counters in successive snapshots:
      `added_per_s` from entries appended, `read_per_s` from entries the group read, over the
      span from the newest earlier snapshot at least `rate_window_ms` old (or the oldest one
      kept that knew the counter) to now. The first snapshot (earlier ones older than
      `MAX_BASE_AGE_WINDOWS` windows are forgotten) and a shard whose counters are unknown or
      went back (a stream deleted and re-created) have no rate.
    - A family's lag is unknown (None) when any shard's is; its rates add up the shards whose
      rate is known (a shard that never had an entry has none), None when none is.
    """

    MAX_BASE_AGE_WINDOWS = 6

    def __init__(
        self,
        *,
        leases: LeaseStore,
        source: EventSource,
        progress: ShardProgress,
        archive: DeadLetterArchive,
        families: Sequence[StreamFamily],
        group: str,
        rate_window_ms: int = 10_000,
    ) -> None:
        self._leases = leases
        self._source = source
        self._progress = progress
        self._archive = archive
        self._families = tuple(families)
        self._group = group
        self._window_ms = rate_window_ms
        # Several consoles may poll at once; a bound keeps their samples from piling up.
        self._samples: deque[_Sample] = deque(maxlen=256)

    async def __call__(self) -> ConsoleSnapshot:
        view = await self._leases.view()
        stats = {s.stream: s for s in await self._source.shard_stats()}
        counters = {c.stream: c for c in await self._progress.counters()}
        tallies = [await self._archive.tally(f) for f in self._families]
        now = view.now_ms
        rates = self._rates(_Sample(now, counters))
        domains = []
        for family, tally in zip(self._families, tallies, strict=True):
            rows = []
            for stream in family.streams:
                lease = view.leases.get(stream)
                stat = stats.get(stream)
                added, read = rates.get(stream, (None, None))
                rows.append(
                    ShardRow(
                        stream=stream,
                        shard=int(stream.rpartition(":")[2]),
                        holder=lease.owner if lease else None,
                        token=lease.token if lease else None,
                        since_ms=lease.since_ms if lease else None,
                        lease_expires_in_ms=max(lease.expires_ms - now, 0) if lease else None,
                        lag=stat.lag if stat else None,
                        pending=stat.pending if stat else 0,
                        added_per_s=added,
                        read_per_s=read,
                    )
                )
            domains.append(
                DomainRow(
                    domain=family.domain,
                    prefix=family.prefix,
                    lag=_total([r.lag for r in rows]),
                    pending=sum(r.pending for r in rows),
                    added_per_s=_known_total([r.added_per_s for r in rows]),
                    read_per_s=_known_total([r.read_per_s for r in rows]),
                    dead_letters=tally.count,
                    newest_dead_letter=tally.newest_id,
                    shards=tuple(rows),
                )
            )
        held: dict[str, list[str]] = {}
        for stream, lease in view.leases.items():
            held.setdefault(lease.owner, []).append(stream)
        routers = tuple(
            RouterRow(name, max(expires - now, 0), tuple(sorted(held.get(name, []))))
            for name, expires in sorted(view.routers.items())
        )
        return ConsoleSnapshot(self._group, now, self._window_ms, routers, tuple(domains))

    def _rates(self, sample: _Sample) -> dict[str, tuple[float | None, float | None]]:
        samples = self._samples
        oldest_kept = sample.at_ms - self.MAX_BASE_AGE_WINDOWS * self._window_ms
        while samples and samples[0].at_ms < oldest_kept:
            samples.popleft()
        while len(samples) >= 2 and samples[1].at_ms <= sample.at_ms - self._window_ms:
            samples.popleft()
        earlier = [s for s in samples if s.at_ms < sample.at_ms]
        samples.append(sample)
        return {
            stream: (
                _rate(earlier, stream, now.added, lambda c: c.added, sample.at_ms),
                _rate(earlier, stream, now.read, lambda c: c.read, sample.at_ms),
            )
            for stream, now in sample.counters.items()
        }


def _rate(
    earlier: Sequence[_Sample],
    stream: str,
    now: int | None,
    counter: Callable[[ShardCounters], int | None],
    now_ms: int,
) -> float | None:
    """Per second since the oldest earlier sample that knew the counter (a group created on
    an empty stream tells its reads only once it has read)."""
    if now is None:
        return None
    for sample in earlier:
        counters = sample.counters.get(stream)
        then = counter(counters) if counters is not None else None
        if then is not None:
            return (now - then) * 1000 / (now_ms - sample.at_ms) if now >= then else None
    return None


def _total(values: Sequence[Number | None]) -> Number | None:
    known = [v for v in values if v is not None]
    return sum(known[1:], known[0]) if known and len(known) == len(values) else None


def _known_total(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None
