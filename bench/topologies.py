"""The Redis topologies the topology comparison drains its backlog on, as throwaway processes.

- `Standalone`: one redis-server, plain shard names (`scan:events:0`).
- `Sentinel`: a master, one replica and three Sentinels; the router finds the master through
  the Sentinels (`redis+sentinel://`), the shards keep their plain names.
- `Cluster`: three masters with one replica each (`redis+cluster://`); the shards are
  hash-tagged (`scan:events:{44971}:0`), as the routers and producers name them there.

Each run starts a fresh one (empty keyspace, new ports) and stops it afterwards. Every data
node is listed by role, so the bench can read each one's CPU.
"""

from __future__ import annotations

from types import TracebackType
from typing import ClassVar, Self

import redis
import redis.cluster

from bench.backlog import FAMILY, Client
from eco_router.adapters.redis.connections.connection import sync_redis_client
from eco_router.domain.streams import StreamFamily
from eco_router.testing import ClusterGroup, RedisServer, SentinelGroup

CLUSTER_MASTERS = 3
SENTINEL_REPLICAS = 1


class Topology:
    """One throwaway topology for the streams role: its URL, its shard names, its nodes."""

    key: ClassVar[str]
    title: ClassVar[str]
    tagged: ClassVar[bool] = False
    # Router settings of this column beyond the shared ones (the durability knob).
    router_settings: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, shards: int = FAMILY.shards) -> None:
        self.family = StreamFamily(FAMILY.prefix, shards, tagged=self.tagged)
        self.masters: list[RedisServer] = []
        self.replicas: list[RedisServer] = []
        self.sentinels: list[RedisServer] = []

    @property
    def url(self) -> str:
        """What REDIS_STREAMS_URL is set to."""
        raise NotImplementedError

    def start(self) -> None:
        """Start every process; return once the topology serves commands (and fails over)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop every process and delete its data; idempotent."""
        raise NotImplementedError

    def client(self) -> Client:
        """A client of the streams role, as the producer SDK opens it for `url`."""
        return sync_redis_client(self.url)

    def shards_per_master(self, client: Client) -> list[int]:
        """How many of the shards each master (in `masters` order) holds."""
        if not isinstance(client, redis.cluster.RedisCluster):
            return [self.family.shards]
        nodes = [
            client.get_node_from_key(stream)  # type: ignore[no-untyped-call]
            for stream in self.family.streams
        ]
        ports = [None if node is None else node.port for node in nodes]
        return [ports.count(master.port) for master in self.masters]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Standalone(Topology):
    """One redis-server."""

    key = "standalone"
    title = "standalone"

    def __init__(self, shards: int = FAMILY.shards) -> None:
        super().__init__(shards)
        self._server = RedisServer()

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> None:
        self._server.start()
        self.masters = [self._server]

    def stop(self) -> None:
        self._server.cleanup()


class Sentinel(Topology):
    """A master with one replica, monitored by three Sentinels."""

    key = "sentinel"
    title = "sentinel, 1 replica"

    def __init__(self, shards: int = FAMILY.shards) -> None:
        super().__init__(shards)
        self._group = SentinelGroup(replicas=SENTINEL_REPLICAS)

    @property
    def url(self) -> str:
        return self._group.url

    def start(self) -> None:
        self._group.start()
        self.masters = [self._group.master()]
        self.replicas = self._group.replicas()
        self.sentinels = list(self._group.sentinels)

    def stop(self) -> None:
        self._group.stop()


class Cluster(Topology):
    """Three masters with one replica each; the shards are hash-tagged."""

    key = "cluster"
    title = f"cluster, {CLUSTER_MASTERS} masters"
    tagged = True

    def __init__(self, shards: int = FAMILY.shards) -> None:
        super().__init__(shards)
        self._group = ClusterGroup(masters=CLUSTER_MASTERS, replicas_per_master=1)

    @property
    def url(self) -> str:
        return self._group.url

    def start(self) -> None:
        self._group.start()
        # By first slot, so the masters keep their order from one run to the next.
        masters = self._group.masters()
        self.masters = [m.master for m in masters]
        self.replicas = [r for m in masters for r in m.replicas]

    def stop(self) -> None:
        self._group.stop()


class SentinelWaiting(Sentinel):
    """The Sentinel group, the router waiting for its replica before each publish."""

    key = "sentinel-wait"
    title = "sentinel, WAIT 1"
    router_settings = (("EVENT_ROUTER_WAIT_REPLICAS", "1"),)


class ClusterWaiting(Cluster):
    """The cluster, the router waiting for each slot's replica before each publish."""

    key = "cluster-wait"
    title = "cluster, WAIT 1"
    router_settings = (("EVENT_ROUTER_WAIT_REPLICAS", "1"),)


TOPOLOGIES: tuple[type[Topology], ...] = (
    Standalone,
    Sentinel,
    Cluster,
    SentinelWaiting,
    ClusterWaiting,
)


def node_client(server: RedisServer) -> redis.Redis:
    """A client of this one node, whatever the topology (INFO, CLIENT LIST, CONFIG RESETSTAT)."""
    return redis.Redis(host="127.0.0.1", port=server.port)
