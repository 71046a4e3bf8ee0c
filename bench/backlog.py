"""The router benchmark's backlog: a realistic mix of job events, filled out of the group's sight.

A drain must start at the same moment for every router it runs, however many of them there
are and however long they take to start. So the backlog is written before the routers start,
with the consumer group created at its end, and each shard's last entry held back. Once the
routers read (their groups exist, their leases are settled), one MULTI moves the group back to
the start of every shard and adds the held-back entries, which wakes every blocked read.

On a Redis Cluster the shards are hash-tagged (`StreamFamily(..., tagged=True)`, as the routers
name them on a cluster URL) and live on several nodes: the client is a `RedisCluster`, whose
pipelines split by node, and the gate is one pipeline sent to every node at once instead of a
MULTI (a transaction cannot span slots).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.cluster

from eco_router.domain.streams import StreamFamily, shard_for

FAMILY = StreamFamily("scan:events", 4)
GROUP = "eventrouter"

DUPLICATE_SHARE = 0.05
LATE_SHARE = 0.03
FILL_PIPELINE = 1_000
STAGES = ("fetch", "resolve", "scan", "analyze", "report")

Entry = tuple[str, dict[str, str]]
# What the helpers below write and probe through: one server, or a cluster's client.
Client = redis.Redis | redis.cluster.RedisCluster


@dataclass(frozen=True, slots=True)
class Workload:
    """Entries in XADD order, and how many of them are retries and late arrivals."""

    entries: list[Entry]
    jobs: int
    duplicates: int
    late: int


def make_workload(events: int, jobs: int, seed: int, family: StreamFamily = FAMILY) -> Workload:
    """`events` entries for `jobs` jobs: queued, running, progress..., done (with result JSON),
    each on its job's shard of `family` (the same entries for any family of the same seed).

    Jobs run concurrently (their events interleave at random, each job's own in seq order).
    ~5% of entries are retries (an entry added again, same job/seq/fields, a little later);
    ~3% are late: held back and added only after 1-3 newer events of the same job.
    """
    rng = random.Random(seed)
    duplicates = round(events * DUPLICATE_SHARE)
    base = events - duplicates
    if base < 3 * jobs:
        raise SystemExit(f"{events} events are too few for {jobs} jobs (3+ events per job)")
    job_ids = [f"scan-{i:06d}-{rng.getrandbits(32):08x}" for i in range(jobs)]
    per_job = [base // jobs + (1 if i < base % jobs else 0) for i in range(jobs)]
    streams = [family.stream_for(job_id) for job_id in job_ids]
    started_ms = int(time.time() * 1000) - 600_000

    # Jobs interleave at random; the key of each event is its place in the global order.
    order = [j for j, n in enumerate(per_job) for _ in range(n)]
    rng.shuffle(order)
    next_seq = [0] * jobs
    keyed: list[tuple[float, int, int]] = []  # (position, job, seq)
    position_of: dict[tuple[int, int], int] = {}
    for position, job in enumerate(order):
        keyed.append((float(position), job, next_seq[job]))
        position_of[(job, next_seq[job])] = position
        next_seq[job] += 1

    # Late: an event moves to just after the k-th newer event of its job (k = 1..3).
    late_candidates = [i for i, (_, job, seq) in enumerate(keyed) if seq < per_job[job] - 1]
    late_indices = rng.sample(
        late_candidates, min(len(late_candidates), round(events * LATE_SHARE))
    )
    for i in late_indices:
        _, job, seq = keyed[i]
        newer = min(seq + rng.randint(1, 3), per_job[job] - 1)
        keyed[i] = (position_of[(job, newer)] + 0.5, job, seq)

    # Retries: the same event again, 1-400 positions later (a producer retrying after a timeout).
    for i in rng.sample(range(len(keyed)), duplicates):
        at, job, seq = keyed[i]
        keyed.append((at + rng.randint(1, 400) + 0.25, job, seq))

    keyed.sort()
    entries = [
        (streams[job], _job_fields(job_ids[job], seq, per_job[job], started_ms, rng))
        for _, job, seq in keyed
    ]
    return Workload(entries, jobs, duplicates, len(late_indices))


def _job_fields(
    job_id: str, seq: int, count: int, started_ms: int, rng: random.Random
) -> dict[str, str]:
    """The fields of a job's `seq`-th of `count` events (deterministic apart from ts jitter)."""
    last = count - 1
    fields = {"job_id": job_id, "seq": str(seq), "ts": str(started_ms + seq * 250)}
    if seq == 0:
        fields.update(stage="queued", status="queued", progress="0")
    elif seq == last:
        findings = (seq * 7919 + len(job_id)) % 40
        result = {
            "findings": findings,
            "severity": {"high": findings // 8, "medium": findings // 3, "low": findings},
            "score": round(100 - findings * 1.7, 1),
            "report_url": f"https://reports.example.com/scan/{job_id}.html",
            "duration_ms": seq * 250 + rng.randint(0, 99),
        }
        fields.update(stage="done", status="done", progress="100", result=json.dumps(result))
    else:
        progress = seq * 100 // last
        fields.update(
            stage=STAGES[min(len(STAGES) - 1, progress * len(STAGES) // 100)],
            status="running",
            progress=str(progress),
            worker=f"scanner-{sum(job_id.encode()) % 8}",
        )
    return fields


def stream_of(job_id: str) -> str:
    """The shard a producer writes `job_id` to: the router's own md5 rule."""
    return f"{FAMILY.prefix}:{shard_for(job_id, FAMILY.shards)}"


# --------------------------------------------------------------------------- the gate


@dataclass(frozen=True, slots=True)
class HiddenBacklog:
    """A backlog in the streams behind the group's position; `held_back` opens it."""

    events: int
    held_back: dict[str, dict[str, str]]  # per shard: the fields of its last entry
    fill_s: float


def fill_hidden(client: Client, workload: Workload, family: StreamFamily = FAMILY) -> HiddenBacklog:
    """XADD all but each shard's last entry, then create the group at the end of every shard
    of `family` (the family the workload was made for)."""
    last_of = {stream: i for i, (stream, _) in enumerate(workload.entries)}
    held = set(last_of.values())
    started = time.perf_counter()
    written = [entry for i, entry in enumerate(workload.entries) if i not in held]
    _xadd(client, written)
    added = Counter(stream for stream, _ in written)
    pipe = client.pipeline(transaction=False)
    for stream in family.streams:
        # ENTRIESREAD makes the lag known (0) at once, as if the group had read everything.
        pipe.xgroup_create(stream, GROUP, id="$", mkstream=True, entries_read=added[stream])
    pipe.execute()
    return HiddenBacklog(
        events=len(workload.entries),
        held_back={workload.entries[i][0]: workload.entries[i][1] for i in last_of.values()},
        fill_s=time.perf_counter() - started,
    )


def open_gate(client: Client, backlog: HiddenBacklog, family: StreamFamily = FAMILY) -> float:
    """Show the whole backlog to the group at once; the monotonic time just before.

    On a cluster, each node gets its shards' commands in order on one connection, written to
    every node before any reply is read: not atomic across nodes, but no node waits for another.
    """
    cluster = isinstance(client, redis.cluster.RedisCluster)
    pipe = client.pipeline(transaction=not cluster)
    for stream in family.streams:
        pipe.xgroup_setid(stream, GROUP, id="0", entries_read=0)
    for stream, fields in backlog.held_back.items():
        pipe.xadd(stream, fields)  # type: ignore[arg-type]
    opened = time.monotonic()
    pipe.execute()
    return opened


def _xadd(client: Client, entries: Sequence[Entry]) -> None:
    for start in range(0, len(entries), FILL_PIPELINE):
        pipe = client.pipeline(transaction=False)
        for stream, fields in entries[start : start + FILL_PIPELINE]:
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
        pipe.execute()


# --------------------------------------------------------------------------- group probes


@dataclass(slots=True)
class GroupState:
    """The consumer group on every shard: whether it exists, what it read, what is left."""

    exists: bool
    entries_read: int
    lag: int
    pending: int

    @property
    def drained(self) -> bool:
        return self.exists and self.lag == 0 and self.pending == 0


def group_state(client: Client, family: StreamFamily = FAMILY) -> GroupState:
    pipe = client.pipeline(transaction=False)
    for stream in family.streams:
        pipe.xinfo_groups(stream)
    replies = pipe.execute(raise_on_error=False)
    state = GroupState(exists=True, entries_read=0, lag=0, pending=0)
    for reply in replies:
        group = None
        if isinstance(reply, list):
            group = next((g for g in reply if text(g.get("name")) == GROUP), None)
        if group is None:
            state.exists = False
            continue
        state.entries_read += int(group.get("entries-read") or 0)
        state.pending += int(group.get("pending") or 0)
        lag = group.get("lag")
        # Redis reports no lag when it cannot tell; count that as not drained.
        state.lag += int(lag) if lag is not None else 1
    return state


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
