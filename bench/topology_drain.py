"""The topology comparison: one router drains the same backlog on one server, a Sentinel group
and a 3-master Redis Cluster; events/s, and the CPU per event of every Redis node by role.

Only the streams URL differs between the columns: the router has the same settings, and
Pub/Sub goes to one plain throwaway redis-server in every column, so each data node's CPU is
the streams role's work (reads, apply scripts, acks, leases, replication) and nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from statistics import median_low

import redis

from bench.backlog import Workload, fill_hidden, open_gate
from bench.redis_probes import command_calls, command_usec, redis_cpu_seconds, watch_drain
from bench.routers import RouterKind, wait_until_reading
from bench.topologies import Topology, node_client
from eco_router.testing import RedisServer

# How much more CPU per event the masters of a topology may spend than the standalone server
# before the comparison flags it.
MASTERS_CPU_BOUND = 0.25


@dataclass(slots=True)
class TopologyDrain:
    """A drain of a pre-filled backlog by one router on one topology."""

    topology: str
    title: str
    events: int
    jobs: int
    fill_s: float
    startup_s: float
    drain_s: float
    events_per_s: float
    # Per master, in the topology's order (a cluster's by first slot); then their sum and the
    # most loaded over the least loaded (None with one master).
    shards_per_master: list[int]
    master_cpu_us_per_event: list[float]
    masters_cpu_us_per_event: float
    master_balance: float | None
    replica_cpu_us_per_event: list[float]
    replicas_cpu_us_per_event: float
    sentinels_cpu_us_per_event: float
    pubsub_cpu_us_per_event: float
    worker_cpu_us_per_event: float
    mean_batch_size: float | None
    verdicts: dict[str, int]
    # Summed over the masters: server time, and calls per 1,000 events.
    redis_usec_per_event_by_command: dict[str, float]
    redis_calls_per_1k_events_by_command: dict[str, float]
    # Every repeat, in run order. Above: the run with the median events/s, its CPU figures
    # replaced by their own medians over the runs.
    runs_events_per_s: list[float] = field(default_factory=list)
    runs_masters_cpu_us_per_event: list[float] = field(default_factory=list)
    runs_master_balance: list[float | None] = field(default_factory=list)


def measure_topology_drain(
    topology: Topology, pubsub: RedisServer, *, kind: RouterKind, workload: Workload
) -> TopologyDrain:
    """Fill `workload` (made for `topology.family`) out of sight, start `kind`'s router on the
    topology's URL, open the gate and time the drain, reading every node's CPU around it."""
    family = topology.family
    client = topology.client()
    masters = [node_client(s) for s in topology.masters]
    replicas = [node_client(s) for s in topology.replicas]
    sentinels = [node_client(s) for s in topology.sentinels]
    pubsub_client = redis.Redis.from_url(pubsub.url)
    try:
        shards_per_master = topology.shards_per_master(client)
        backlog = fill_hidden(client, workload, family)
        spawned = time.monotonic()
        with ExitStack() as routers_stack:
            routers = [
                routers_stack.enter_context(kind.spawn(topology.url, pubsub.url, name=name))
                for name in kind.names("topology")
            ]
            wait_until_reading(client, routers, family=family, servers=masters)
            startup_s = time.monotonic() - spawned
            for master in masters:
                master.config_resetstat()
            before = _cpu(masters, replicas, sentinels, [pubsub_client])
            router_cpu_before = sum(r.cpu_seconds() for r in routers)
            opened_at = open_gate(client, backlog, family)
            drained_at = watch_drain(client, routers, backlog.events, family)
            router_cpu = sum(r.cpu_seconds() for r in routers) - router_cpu_before
            after = _cpu(masters, replicas, sentinels, [pubsub_client])
            usec: dict[str, int] = {}
            calls: dict[str, int] = {}
            for master in masters:
                for name, us in command_usec(master).items():
                    usec[name] = usec.get(name, 0) + us
                for name, n in command_calls(master).items():
                    calls[name] = calls.get(name, 0) + n
        figures = [r.figures for r in routers]  # collected as each stopped
    finally:
        for node in (client, *masters, *replicas, *sentinels, pubsub_client):
            node.close()
    events = backlog.events
    drain_s = drained_at - opened_at

    def per_event(role: int) -> list[float]:
        return [(a - b) * 1e6 / events for a, b in zip(after[role], before[role], strict=True)]

    master_cpu, replica_cpu, sentinel_cpu, pubsub_cpu = (per_event(r) for r in range(4))
    batches = sum(f.get("batch_size_count", 0.0) for f in figures)
    return TopologyDrain(
        topology=topology.key,
        title=topology.title,
        events=events,
        jobs=workload.jobs,
        fill_s=backlog.fill_s,
        startup_s=startup_s,
        drain_s=drain_s,
        events_per_s=events / drain_s,
        shards_per_master=shards_per_master,
        master_cpu_us_per_event=master_cpu,
        masters_cpu_us_per_event=sum(master_cpu),
        master_balance=_balance(master_cpu),
        replica_cpu_us_per_event=replica_cpu,
        replicas_cpu_us_per_event=sum(replica_cpu),
        sentinels_cpu_us_per_event=sum(sentinel_cpu),
        pubsub_cpu_us_per_event=pubsub_cpu[0],
        worker_cpu_us_per_event=router_cpu * 1e6 / events,
        mean_batch_size=(
            sum(f.get("batch_size_sum", 0.0) for f in figures) / batches if batches else None
        ),
        verdicts={
            v: int(sum(f.get(v, 0.0) for f in figures))
            for v in ("new", "duplicate", "stale", "invalid")
            if any(v in f for f in figures)
        },
        redis_usec_per_event_by_command={
            name: round(us / events, 2)
            for name, us in sorted(usec.items(), key=lambda item: -item[1])
            if name not in ("config|resetstat", "info")
        },
        redis_calls_per_1k_events_by_command={
            name: round(n * 1000 / events, 1)
            for name, n in calls.items()
            if name not in ("config|resetstat", "info")
        },
    )


def _cpu(*roles: Sequence[redis.Redis]) -> list[list[float]]:
    """Every node's CPU seconds so far, role by role; the nodes one after the other, so the
    first and the last of a role are read a few hundred microseconds apart."""
    return [[redis_cpu_seconds(node) for node in nodes] for nodes in roles]


def _balance(cpu: Sequence[float]) -> float | None:
    """The most loaded master's CPU over the least loaded one's; None with one master."""
    if len(cpu) < 2:
        return None
    return max(cpu) / min(cpu) if min(cpu) > 0 else math.inf


def median_topology_drain(runs: Sequence[TopologyDrain]) -> TopologyDrain:
    """The run with the median events/s, each CPU figure the median over the runs on its own
    (per master and per replica by position: a cluster's masters keep their slots)."""
    median = sorted(runs, key=lambda t: t.events_per_s)[(len(runs) - 1) // 2]
    median.runs_events_per_s = [round(t.events_per_s) for t in runs]
    median.runs_masters_cpu_us_per_event = [round(t.masters_cpu_us_per_event, 1) for t in runs]
    median.runs_master_balance = [
        None if t.master_balance is None else round(t.master_balance, 2) for t in runs
    ]
    for name in (
        "masters_cpu_us_per_event",
        "replicas_cpu_us_per_event",
        "sentinels_cpu_us_per_event",
        "pubsub_cpu_us_per_event",
        "worker_cpu_us_per_event",
    ):
        setattr(median, name, median_low(getattr(t, name) for t in runs))
    median.master_cpu_us_per_event = _positionwise(t.master_cpu_us_per_event for t in runs)
    median.replica_cpu_us_per_event = _positionwise(t.replica_cpu_us_per_event for t in runs)
    if median.master_balance is not None:
        median.master_balance = median_low(
            t.master_balance for t in runs if t.master_balance is not None
        )
    return median


def _positionwise(lists: Iterable[Sequence[float]]) -> list[float]:
    return [median_low(column) for column in zip(*lists, strict=True)]


# --------------------------------------------------------------------------- the table

Cell = Callable[[TopologyDrain], str]


def _list(values: Sequence[float], spec: str = "{:.1f}") -> str:
    return " / ".join(spec.format(v) for v in values) if values else "n/a"


def _span(values: Sequence[float], spec: str) -> str:
    return f"{spec.format(min(values))} - {spec.format(max(values))}" if values else "n/a"


ROWS: tuple[tuple[str, Cell], ...] = (
    ("backlog events / jobs", lambda t: f"{t.events:,} / {t.jobs:,}"),
    ("verdicts new/dup/stale/inv", lambda t: _verdicts(t.verdicts)),
    ("mean batch size (entries)", lambda t: _num(t.mean_batch_size, 1)),
    ("drain time (s)", lambda t: f"{t.drain_s:.2f}"),
    ("  router start-up (s)", lambda t: f"{t.startup_s:.2f}"),
    ("throughput (events/s)", lambda t: f"{t.events_per_s:,.0f}"),
    ("  min - max over runs", lambda t: _span(t.runs_events_per_s, "{:,.0f}")),
    ("shards per master", lambda t: _list(t.shards_per_master, "{}")),
    ("CPU per master (us/event)", lambda t: _list(t.master_cpu_us_per_event)),
    ("masters' CPU, all (us/event)", lambda t: f"{t.masters_cpu_us_per_event:.1f}"),
    ("  min - max over runs", lambda t: _span(t.runs_masters_cpu_us_per_event, "{:.1f}")),
    ("master balance (max / min)", lambda t: _num(t.master_balance, 2)),
    ("CPU per replica (us/event)", lambda t: _list(t.replica_cpu_us_per_event)),
    ("replicas' CPU, all (us/event)", lambda t: _num(t.replicas_cpu_us_per_event, 1)),
    ("sentinels' CPU, all (us/event)", lambda t: _num(t.sentinels_cpu_us_per_event, 1)),
    ("pubsub redis CPU (us/event)", lambda t: f"{t.pubsub_cpu_us_per_event:.1f}"),
    ("router CPU (us/event)", lambda t: f"{t.worker_cpu_us_per_event:.1f}"),
)


def comparison(drains: dict[str, TopologyDrain]) -> dict[str, float]:
    """Throughput and masters' CPU per event of the Sentinel group and the cluster over the
    standalone server's, and of the cluster over the Sentinel group's (both replicated)."""
    ratios: dict[str, float] = {}
    pairs = [(key, "standalone") for key in drains if key != "standalone"]
    pairs += [("cluster", "sentinel"), ("sentinel-wait", "sentinel"), ("cluster-wait", "cluster")]
    for key, base_key in pairs:
        if key not in drains or base_key not in drains:
            continue
        drain, base = drains[key], drains[base_key]
        ratios[f"throughput_{key}_over_{base_key}"] = round(
            drain.events_per_s / base.events_per_s, 3
        )
        ratios[f"masters_cpu_{key}_over_{base_key}"] = round(
            drain.masters_cpu_us_per_event / base.masters_cpu_us_per_event, 3
        )
    return ratios


def print_section(
    number: int, drains: dict[str, TopologyDrain], *, label_width: int, column_width: int
) -> None:
    """The section's table, its verdict lines and each column's time per command."""
    if not drains:
        return
    first = next(iter(drains.values()))
    print()
    print(f"{number}. TOPOLOGIES: ONE ROUTER ON ONE SERVER, A SENTINEL GROUP, A REDIS CLUSTER")
    print(
        f"   the same backlog ({first.events:,} events, {first.jobs:,} jobs, "
        f"{sum(first.shards_per_master)} shards) and router settings in every column, only "
        "REDIS_STREAMS_URL differs; Pub/Sub on one plain server in every column; "
        f"medians over {len(first.runs_events_per_s)} interleaved round(s)"
    )

    def row(label: str, values: Sequence[str]) -> None:
        print(f"{label:<{label_width}}" + "".join(f"{v:>{column_width}}" for v in values))

    row("", [d.title for d in drains.values()])
    for label, cell in ROWS:
        row(label, [cell(d) for d in drains.values()])
    ratios = comparison(drains)
    base = drains.get("standalone")
    for key, drain in drains.items():
        if base is None or key == "standalone":
            continue
        change = ratios[f"masters_cpu_{key}_over_standalone"] - 1
        bound = "above" if change > MASTERS_CPU_BOUND else "within"
        balance = (
            ""
            if drain.master_balance is None
            else f"; masters' balance {drain.master_balance:.2f} (shares "
            + " / ".join(
                f"{c / drain.masters_cpu_us_per_event * 100:.0f} %"
                for c in drain.master_cpu_us_per_event
            )
            + ")"
        )
        print(
            f"{drain.title} vs standalone: throughput "
            f"{ratios[f'throughput_{key}_over_standalone']:.2f}x; masters' CPU per event "
            f"{change * 100:+.1f} % ({bound} the +{MASTERS_CPU_BOUND * 100:.0f} % bound){balance}"
        )
    if "throughput_cluster_over_sentinel" in ratios:
        print(
            f"{drains['cluster'].title} vs {drains['sentinel'].title} (both replicate every "
            f"write): throughput {ratios['throughput_cluster_over_sentinel']:.2f}x; masters' "
            f"CPU per event {(ratios['masters_cpu_cluster_over_sentinel'] - 1) * 100:+.1f} %"
        )
    for key, base_key in (("sentinel-wait", "sentinel"), ("cluster-wait", "cluster")):
        if f"throughput_{key}_over_{base_key}" in ratios:
            print(
                f"{drains[key].title} vs {drains[base_key].title} (the cost of "
                f"EVENT_ROUTER_WAIT_REPLICAS=1): throughput "
                f"{ratios[f'throughput_{key}_over_{base_key}']:.2f}x; masters' CPU per event "
                f"{(ratios[f'masters_cpu_{key}_over_{base_key}'] - 1) * 100:+.1f} %"
            )
    print(
        "masters' server time per event by command, summed (INFO commandstats, us; in "
        "brackets calls per 1,000 events):"
    )
    for drain in drains.values():
        calls = drain.redis_calls_per_1k_events_by_command
        top = ", ".join(
            f"{c} {u} ({calls.get(c, 0):g})"
            for c, u in drain.redis_usec_per_event_by_command.items()
            if u
        )
        print(f"  {drain.title}: {top}")


def _verdicts(verdicts: dict[str, int]) -> str:
    return "/".join(str(verdicts.get(v, 0)) for v in ("new", "duplicate", "stale", "invalid"))


def _num(value: float | None, digits: int, missing: str = "n/a") -> str:
    return missing if value is None else f"{value:.{digits}f}"


DEFINITIONS = {
    "topologies": (
        "one router (this tree's worker, default settings, EVENT_ROUTER_STREAMS the same in "
        "every column) drains the same backlog on a fresh standalone server, a fresh Sentinel "
        "group (a master, 1 replica, 3 Sentinels; redis+sentinel://) and a fresh Redis Cluster "
        "(3 masters, 1 replica each; redis+cluster://, shards hash-tagged as the router names "
        "them there); Pub/Sub on a plain redis-server in every column. The gate is one MULTI "
        "on one server; on the cluster one pipeline written to every node before any reply is "
        "read (a transaction cannot span slots)"
    ),
    "master_cpu_us_per_event": (
        "per master (a cluster's in slot order), used_cpu_sys + used_cpu_user (INFO cpu) at "
        "t_drained minus at t_open, per entry; includes the bench's XINFO polling, the "
        "router's heartbeats, replication to the replicas and, on a cluster, its bus; "
        "masters' CPU, all = their sum; balance = the most loaded master's over the least "
        "loaded one's"
    ),
    "replica_cpu_us_per_event": (
        "the same for each replica (applying the replication stream), and for the Sentinels "
        "together"
    ),
}
