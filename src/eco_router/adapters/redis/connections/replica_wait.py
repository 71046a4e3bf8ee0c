"""Writes acknowledged by replicas: a script call followed by WAIT on the same connection.

Redis replicates asynchronously: a master lost right after it answered can take the write
with it. `WAIT n timeout` blocks until `n` replicas have what this connection wrote, so it
must run on the connection that wrote: both commands go in one pipeline to the node that
owns the script's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.cluster
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.connections.round_trips import PooledRoundTrips, RoundTrips
from eco_router.application.errors import ReplicasBehind

__all__ = ["ReplicaWait", "ReplicasBehind"]

Arguments = Sequence[str | int | bytes]


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """How many replicas must acknowledge each write (0: none, plain asynchronous
    replication), and how long to wait for them."""

    replicas: int = 0
    timeout_ms: int = 500

    async def call(
        self,
        client: RedisClient,
        script: AsyncScript,
        keys: Sequence[str],
        args: Arguments,
        *,
        trips: RoundTrips | None = None,
    ) -> Any:
        """`script(keys, args)`, then, if asked, WAIT for the replicas on its connection; sent
        by `trips` where given, else through the client's pool."""
        trips = trips or PooledRoundTrips()
        if not self.replicas:
            return await trips.call_script(script, keys, args)
        try:
            reply, acked = await self._call_and_wait(client, trips, script, keys, args)
        except NoScriptError:
            # A pipeline does not load scripts by itself; the second try finds it.
            await client.script_load(script.script)
            reply, acked = await self._call_and_wait(client, trips, script, keys, args)
        self._check(acked)
        return reply

    def call_sync(
        self,
        client: redis.Redis | redis.cluster.RedisCluster,
        script: Script,
        keys: Sequence[str],
        args: Arguments,
    ) -> Any:
        """`call` for a blocking client."""
        if not self.replicas:
            return script(keys=keys, args=args)
        try:
            reply, acked = self._call_and_wait_sync(client, script, keys, args)
        except NoScriptError:
            client.script_load(script.script)
            reply, acked = self._call_and_wait_sync(client, script, keys, args)
        self._check(acked)
        return reply

    async def _call_and_wait(
        self,
        client: RedisClient,
        trips: RoundTrips,
        script: AsyncScript,
        keys: Sequence[str],
        args: Arguments,
    ) -> tuple[Any, int]:
        on_node: dict[str, Any] = {}
        if isinstance(client, RedisCluster):
            await client.initialize()  # learns the slots on first use, then returns at once
            on_node["target_nodes"] = client.get_node_from_key(keys[0])
        async with client.pipeline(transaction=False) as pipe:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms, **on_node)
            reply, acked = await trips.execute(pipe)
        for answer in (reply, acked):
            if isinstance(answer, Exception):
                raise answer
        return reply, int(acked)

    def _call_and_wait_sync(
        self,
        client: redis.Redis | redis.cluster.RedisCluster,
        script: Script,
        keys: Sequence[str],
        args: Arguments,
    ) -> tuple[Any, int]:
        on_node: dict[str, Any] = {}
        if isinstance(client, redis.cluster.RedisCluster):
            on_node["target_nodes"] = client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
        with client.pipeline(transaction=False) as pipe:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms, **on_node)
            reply, acked = pipe.execute()
        return reply, int(acked)

    def _check(self, acked: int) -> None:
        if acked < self.replicas:
            raise ReplicasBehind(
                f"{acked} of {self.replicas} replicas acknowledged the write within "
                f"{self.timeout_ms} ms"
            )
