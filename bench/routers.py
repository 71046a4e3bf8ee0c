"""The routers the router benchmark runs, and how it tells that they all read.

- `Worker`: `eco-router worker` of this tree, or of a baseline commit (`BaselineSource`) run
  with this interpreter and PYTHONPATH pointing at that commit's `src/`.
- `NaiveRouter`: `bench/one_at_a_time.py`, the naive one-event-at-a-time router, or (with
  `module="bench.plain_batch"`) `bench/plain_batch.py`, the plain batch router.
- `RouterKind`: one column of the table: which router, how many of them, which settings.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import redis

from bench.backlog import FAMILY, GROUP, Client, text
from bench.baseline_source import BaselineSource
from bench.router_process import RouterProcess, eco_router_command, eco_router_env
from eco_router.adapters.redis.keys import GroupKeys
from eco_router.domain.streams import StreamFamily

BATCHED_READ_COUNT = 100
PLAIN_BATCH_MODULE = "bench.plain_batch"
LISTEN, ESTABLISHED = "0A", "01"
# A router whose connection last sent one of these has reached its read loop (a read that
# finds nothing creates no consumer, so XINFO CONSUMERS cannot tell).
READ_COMMANDS = frozenset({"xread", "xreadgroup"})
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.02


class Worker(RouterProcess):
    """`eco-router worker`; its figures come from its /metrics page just before it stops."""

    def __init__(
        self,
        streams_url: str,
        pubsub_url: str,
        *,
        read_count: int,
        name: str,
        source: BaselineSource | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        defaults = {
            "EVENT_ROUTER_STREAMS": f"{FAMILY.prefix}={FAMILY.shards}",
            "EVENT_ROUTER_CONSUMER_GROUP": GROUP,
            "EVENT_ROUTER_CONSUMER_NAME": name,
            "EVENT_ROUTER_READ_COUNT": str(read_count),
            "EVENT_ROUTER_HTTP_HOST": "127.0.0.1",
            "EVENT_ROUTER_HTTP_PORT": "0",
            "EVENT_ROUTER_LOG_LEVEL": "WARNING",
        }
        env = eco_router_env(streams_url, pubsub_url, **{**defaults, **(settings or {})})
        if source is None:
            command = eco_router_command("worker")
        else:
            command = [source.python, "-m", "eco_router.entrypoints.cli", "worker"]
            env["PYTHONPATH"] = source.pythonpath()
        super().__init__(command, env=env, name=name)

    def http_url(self) -> str | None:
        port = self._http_port()
        return None if port is None else f"http://127.0.0.1:{port}"

    def metrics(self) -> dict[str, float]:
        """Verdict counts and batch sizes from the worker's /metrics, or {} if unreachable."""
        return self.router_figures()

    def _before_stop(self) -> None:
        self.figures = self.metrics()

    def _http_port(self) -> int | None:
        """The port the worker listens on (it was given port 0)."""
        return min(self.tcp_ports(LISTEN), default=None)


class NaiveRouter(RouterProcess):
    """`python -m bench.one_at_a_time` (or `module`); its figures come from the summary line it
    prints on exit."""

    def __init__(
        self, streams_url: str, pubsub_url: str, *, name: str, module: str = "bench.one_at_a_time"
    ) -> None:
        command = [
            sys.executable,
            "-m",
            module,
            "--streams-url",
            streams_url,
            "--pubsub-url",
            pubsub_url,
            "--group",
            GROUP,
            "--consumer",
            name,
            "--prefix",
            FAMILY.prefix,
            "--shards",
            str(FAMILY.shards),
        ]
        super().__init__(command, env=dict(os.environ), name=name)

    def _after_stop(self) -> None:
        output = Path(self._log.name).read_text(errors="replace")
        summaries = [line for line in output.splitlines() if line.startswith("summary ")]
        if not summaries:
            return
        counts: dict[str, int] = orjson.loads(summaries[-1].removeprefix("summary "))
        self.figures = {name: float(value) for name, value in counts.items()}
        # One entry per read that found one: the same figures the worker's histogram gives.
        self.figures["batch_size_sum"] = float(
            sum(counts.get(v, 0) for v in ("new", "duplicate", "stale", "invalid"))
        )
        self.figures["batch_size_count"] = float(counts.get("reads", 0) - counts.get("empty", 0))


@dataclass(frozen=True, slots=True)
class RouterKind:
    """One column: `routers` processes of one router, with its settings.

    `read_count` None is a standalone bench router, `module` (the naive one by default);
    `source` None is this tree's worker.
    """

    key: str
    title: str
    read_count: int | None
    routers: int = 1
    source: BaselineSource | None = None
    settings: tuple[tuple[str, str], ...] = ()
    module: str = "bench.one_at_a_time"

    @property
    def reads(self) -> str:
        """What one XREADGROUP asks for."""
        if self.module == PLAIN_BATCH_MODULE:
            return f"COUNT {BATCHED_READ_COUNT}, {FAMILY.shards} streams"
        if self.read_count is None:
            return "COUNT 1, 1 stream"
        if self.source is None:
            # Each router reads only the shards it holds.
            return f"COUNT {self.read_count}, held shards"
        return f"COUNT {self.read_count}, {FAMILY.shards} streams"

    def spawn(self, streams_url: str, pubsub_url: str, *, name: str) -> RouterProcess:
        """The process of one of the routers, named `name`."""
        if self.read_count is None:
            return NaiveRouter(streams_url, pubsub_url, name=name, module=self.module)
        return Worker(
            streams_url,
            pubsub_url,
            read_count=self.read_count,
            name=name,
            source=self.source,
            settings=dict(self.settings),
        )

    def names(self, phase: str) -> list[str]:
        slug = self.key.replace("_", "-")
        return [f"bench-{phase}-{slug}-{n}" for n in range(1, self.routers + 1)]


def wait_until_reading(
    client: Client,
    routers: Sequence[RouterProcess],
    *,
    family: StreamFamily = FAMILY,
    servers: Sequence[redis.Redis] | None = None,
) -> dict[str, int]:
    """Until every router reads its share of the shards of `family`; then how many each holds.

    A router reads once one of its connections to a streams server (`servers`, each a client
    of one node; by default `client`, one server) last sent a read (the worker's wait for
    appends, or a blocking XREADGROUP). Several routers read once, besides, each shard's
    lease has an owner, the owners are balanced (no router holds two more than another) and
    every owner reads; standbys hold none.
    """
    deadline = time.monotonic() + READY_TIMEOUT_S
    names = [r.name for r in routers]
    if servers is None:
        assert isinstance(client, redis.Redis), "a cluster's nodes must be given as servers"
        servers = [client]
    while True:
        for router in routers:
            router.check_alive()
        held = _shards_read(client, routers, family, servers)
        if held is not None:
            return held
        if time.monotonic() > deadline:
            raise RuntimeError(f"{', '.join(names)} not all reading after {READY_TIMEOUT_S:.0f}s")
        time.sleep(READY_POLL_S)


def _shards_read(
    client: Client,
    routers: Sequence[RouterProcess],
    family: StreamFamily,
    servers: Sequence[redis.Redis],
) -> dict[str, int] | None:
    reading = _reading(servers, routers)
    if len(routers) == 1:
        return {reading.pop(): family.shards} if reading else None
    owners = Counter(lease_owners(client, family).values())
    if None in owners or any(owner not in reading for owner in owners):
        return None
    counts = [owners.get(r.name, 0) for r in routers]
    if max(counts) - min(counts) > 1:
        return None
    return {r.name: n for r, n in zip(routers, counts, strict=True)}


def _reading(servers: Sequence[redis.Redis], routers: Sequence[RouterProcess]) -> set[str]:
    """The routers with a connection to one of `servers` whose last command was a read."""
    reading_ports = {
        int(c["addr"].rpartition(":")[2])
        for server in servers
        for c in server.client_list()
        if c["cmd"] in READ_COMMANDS
    }
    return {router.name for router in routers if router.tcp_ports(ESTABLISHED) & reading_ports}


def lease_owners(client: Client, family: StreamFamily = FAMILY) -> dict[str, str | None]:
    """Who holds each shard's lease (None: nobody)."""
    keys = GroupKeys(GROUP)
    pipe = client.pipeline(transaction=False)
    for stream in family.streams:
        pipe.hget(keys.lease(stream), "owner")
    replies = pipe.execute()
    return {
        stream: None if owner is None else text(owner)
        for stream, owner in zip(family.streams, replies, strict=True)
    }
