"""Who routes which shard: a pure function of the shards, the live routers and the owners now.

Each shard has at most one live owner, so a job (whose events all land on one shard) is
routed by one router at a time, in stream order. Every router computes the same target from
the same view of the group and moves towards it cooperatively: it takes only free shards and
gives up only shards it has drained, so no two routers ever read one shard at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lease:
    """A shard's owner as the lease store sees it; `token` fences out earlier owners."""

    owner: str
    token: int
    since_ms: int
    expires_ms: int


@dataclass(frozen=True, slots=True)
class Moves:
    """What one router should do now: take these free shards, give up these drained ones."""

    acquire: tuple[str, ...] = ()
    release: tuple[str, ...] = ()


def assign(
    shards: Sequence[str], routers: Iterable[str], owners: Mapping[str, str]
) -> dict[str, str]:
    """The balanced, sticky target owner of every shard.

    - Every router gets ⌊shards/routers⌋ or one more; routers beyond the shard count get none
      (standbys).
    - The larger shares go to the routers holding the most shards now, counted up to a
      larger share (ties by name), and a router keeps the shards it holds up to its share (in
      shard order), so a change of membership moves as few shards as it can. Counting beyond
      a larger share would let the ranking change while routers are still giving shards up,
      telling a router to keep a shard it has started handing over.
    - The remaining shards go, in shard order, to the routers with room, in name order.
    - Owners count as live routers even when missing from `routers` (their lease is live).
    """
    members = sorted(set(routers) | {owners[s] for s in shards if s in owners})
    if not members:
        return {}
    held = Counter(owners[s] for s in shards if s in owners)
    base, extra = divmod(len(shards), len(members))
    ranked = sorted(members, key=lambda r: (-min(held[r], base + 1), r))
    quota = {r: base + (1 if i < extra else 0) for i, r in enumerate(ranked)}
    target: dict[str, str] = {}
    load: Counter[str] = Counter()
    for shard in shards:
        owner = owners.get(shard)
        if owner is not None and load[owner] < quota[owner]:
            target[shard] = owner
            load[owner] += 1
    room = iter([r for r in members for _ in range(quota[r] - load[r])])
    for shard in shards:
        if shard not in target:
            target[shard] = next(room)
    return target


def moves_for(
    me: str, shards: Sequence[str], routers: Iterable[str], owners: Mapping[str, str]
) -> Moves:
    """`me`'s part of `assign`: free shards assigned to it, and its shards assigned elsewhere.

    A shard assigned to `me` that another router still holds is not taken: that router gives
    it up once drained, and the next round takes it.
    """
    target = assign(shards, {*routers, me}, owners)
    return Moves(
        acquire=tuple(s for s in shards if target[s] == me and s not in owners),
        release=tuple(s for s in shards if owners.get(s) == me and target[s] != me),
    )
