"""In-memory leases and fencing tokens, with the Redis adapter's semantics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eco_router.application.errors import TransientError
from eco_router.application.port_values import GroupView
from eco_router.application.ports import Clock, LeaseStore
from eco_router.domain.ownership import Lease


@dataclass(slots=True)
class LeaseTable:
    """What the streams server keeps for one group: live routers, leases, fencing epochs.

    A shard's epoch is the token of its newest holder and never goes back; a write under an
    older token is fenced out.
    """

    clock: Clock
    routers: dict[str, int] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)

    def holds(self, stream: str, token: int) -> bool:
        """Whether `token` is the shard's newest fencing token."""
        return self.epochs.get(stream, 0) == token

    def live_lease(self, stream: str) -> Lease | None:
        lease = self.leases.get(stream)
        if lease is not None and lease.expires_ms <= self.clock.now_ms():
            del self.leases[stream]
            return None
        return lease

    def live_routers(self) -> dict[str, int]:
        now = self.clock.now_ms()
        self.routers = {r: t for r, t in self.routers.items() if t > now}
        return dict(self.routers)


class InMemoryLeaseStore(LeaseStore):
    """`LeaseStore` over a `LeaseTable`; set `available = False` to cut it off."""

    def __init__(self, table: LeaseTable, *, ttl_ms: int) -> None:
        self.table = table
        self.available = True
        self._ttl_ms = ttl_ms

    async def heartbeat(self, router: str, held: Mapping[str, int]) -> GroupView:
        self._check()
        now = self.table.clock.now_ms()
        self.table.routers[router] = now + self._ttl_ms
        for stream, token in held.items():
            if self.table.holds(stream, token):
                lease = self.table.live_lease(stream)
                since = lease.since_ms if lease is not None and lease.token == token else now
                self.table.leases[stream] = Lease(router, token, since, now + self._ttl_ms)
        return self._view()

    async def acquire(self, stream: str, router: str) -> Lease | None:
        self._check()
        if self.table.live_lease(stream) is not None:
            return None
        now = self.table.clock.now_ms()
        token = self.table.epochs.get(stream, 0) + 1
        self.table.epochs[stream] = token
        lease = Lease(router, token, now, now + self._ttl_ms)
        self.table.leases[stream] = lease
        return lease

    async def release(self, stream: str, router: str, token: int) -> None:
        self._check()
        if self.table.holds(stream, token):
            self.table.leases.pop(stream, None)

    async def leave(self, router: str) -> None:
        self._check()
        self.table.routers.pop(router, None)

    async def view(self) -> GroupView:
        self._check()
        return self._view()

    def _view(self) -> GroupView:
        leases = {s: lease for s in list(self.table.leases) if (lease := self.table.live_lease(s))}
        return GroupView(self.table.clock.now_ms(), self.table.live_routers(), leases)

    def _check(self) -> None:
        if not self.available:
            raise TransientError("in-memory lease store marked unavailable")
