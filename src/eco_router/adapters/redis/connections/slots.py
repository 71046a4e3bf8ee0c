"""Work split by Redis Cluster slot: one call per slot, issued together."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster

from eco_router.domain.streams import hash_tag

T = TypeVar("T")
V = TypeVar("V")


def by_slot(values: Mapping[str, V]) -> list[dict[str, V]]:
    """`values` (keyed by stream) in groups whose streams share a hash tag: one group for
    plain shard names (one server holds them all), one per tag for tagged shards."""
    groups: dict[str | None, dict[str, V]] = {}
    for stream, value in values.items():
        groups.setdefault(hash_tag(stream), {})[stream] = value
    return list(groups.values())


async def gather_all(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every call's result, in order; when any failed, the first failure, raised once all have
    finished (none is left running, none fails unobserved)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def nodes_of(client: object, streams: Iterable[str]) -> dict[str, str]:
    """On a Redis Cluster, the `host:port` of the master holding each stream; else empty."""
    if not isinstance(client, RedisCluster):
        return {}
    placed = {}
    for stream in streams:
        node = client.get_node_from_key(stream)
        if node is not None:
            placed[stream] = node.name
    return placed


def on_node_of(client: object, key: str) -> dict[str, Any]:
    """For a cluster client, the node owning `key`'s slot as the command's target: XREAD and
    XREADGROUP have keys a cluster client can only find by asking a server (COMMAND GETKEYS,
    a round trip before every call). Nothing for other clients."""
    if not isinstance(client, RedisCluster):
        return {}
    return {"target_nodes": client.get_node_from_key(key)}
