"""What the router benchmark reads from Redis while routers drain: CPU, time per command, the
moment a backlog is drained."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from bench.backlog import FAMILY, Client, group_state
from bench.router_process import RouterProcess
from eco_router.domain.streams import StreamFamily

POLL_INTERVAL_S = 0.01
DRAIN_TIMEOUT_S = 120.0


def redis_cpu_seconds(client: redis.Redis) -> float:
    """used_cpu_sys + used_cpu_user of the server `client` talks to (INFO cpu)."""
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def command_usec(client: redis.Redis) -> dict[str, int]:
    """Server-side microseconds per command since the last CONFIG RESETSTAT."""
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["usec"]) for name, s in stats.items()}


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT."""
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def watch_drain(
    client: Client,
    routers: Sequence[RouterProcess],
    events: int,
    family: StreamFamily = FAMILY,
) -> float:
    """Poll XINFO GROUPS until no shard has lag or pending entries; the monotonic time then."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        state = group_state(client, family)
        now = time.monotonic()
        if state.drained:
            return now
        for router in routers:
            router.check_alive()
        if now > deadline:
            raise RuntimeError(
                f"not drained after {DRAIN_TIMEOUT_S}s: lag {state.lag}, pending {state.pending} "
                f"of {events}"
            )
        time.sleep(POLL_INTERVAL_S)
