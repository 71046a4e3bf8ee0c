"""Throwaway Redis Sentinel groups and Redis Clusters made of ``RedisServer`` processes."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar

from eco_router.testing import resp
from eco_router.testing.redis_server import RedisServer, redis_cli_binary

logger = logging.getLogger(__name__)

T = TypeVar("T")

_HOST = "127.0.0.1"
_POLL_INTERVAL = 0.05
_BUS_PORT_OFFSET = 10000
_MAX_CLUSTER_PORT = 65535 - _BUS_PORT_OFFSET
_PORT_ATTEMPTS = 1000
# Any node may become a master. Redis 7 otherwise waits 5 s for more replicas before a full
# sync and, on SIGTERM, up to 10 s for lagging replicas; this data is throwaway.
_DATA_NODE_CONFIG = "repl-diskless-sync-delay 0\nshutdown-timeout 0\n"


def _bindable(port: int) -> int | None:
    """The port a loopback bind to ``port`` got (0 picks one), or None if it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((_HOST, port))
        except OSError:
            return None
        bound: int = sock.getsockname()[1]
        return bound


def _free_ports(count: int, *, cluster_bus: bool) -> list[int]:
    """``count`` distinct free loopback ports; with ``cluster_bus`` each port + 10000 is free too
    and no port is another's bus port."""
    taken: set[int] = set()
    ports: list[int] = []
    for _ in range(_PORT_ATTEMPTS):
        if len(ports) == count:
            return ports
        port = _bindable(0)
        if port is None or port in taken:
            continue
        if cluster_bus:
            bus = port + _BUS_PORT_OFFSET
            if port > _MAX_CLUSTER_PORT or bus in taken or _bindable(bus) is None:
                continue
            taken.add(bus)
        taken.add(port)
        ports.append(port)
    if len(ports) == count:
        return ports
    raise RuntimeError(f"found only {len(ports)} of {count} free loopback ports")


def _poll(
    probe: Callable[[], T | None], *, timeout: float, what: str, logs: Callable[[], str]
) -> T:
    """The first non-None value of ``probe``; TimeoutError with the servers' logs otherwise.

    Connection and error replies count as "not yet": servers restart and fail over meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except (OSError, resp.ReplyError):
            value = None
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.1f}s\n{logs()}")
        time.sleep(_POLL_INTERVAL)


def _log_tails(servers: Iterable[RedisServer]) -> str:
    return "\n".join(server.log_tail() for server in servers)


def _replication(server: RedisServer) -> dict[str, str]:
    return resp.fields(resp.call(server.port, "INFO", "replication"))


def _in_sync_replica_of(server: RedisServer, master: RedisServer) -> bool:
    info = _replication(server)
    return (
        info.get("role") == "slave"
        and info.get("master_port") == str(master.port)
        and info.get("master_link_status") == "up"
    )


def _stop_all(servers: Iterable[RedisServer]) -> None:
    """Stop every server and delete its data, even if stopping one of them fails."""
    errors: list[Exception] = []
    for server in servers:
        try:
            server.cleanup()
        except Exception as e:
            errors.append(e)
    if errors:
        raise errors[0]


class SentinelGroup:
    """A master, its replicas and the Sentinels monitoring them, as throwaway processes."""

    def __init__(
        self,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        master_name: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        start_timeout: float = 30.0,
    ) -> None:
        ports = _free_ports(1 + replicas + sentinels, cluster_bus=False)
        master_port = ports[0]
        replica_ports = ports[1 : 1 + replicas]
        sentinel_ports = ports[1 + replicas :]
        self._master_name = master_name
        self._start_timeout = start_timeout
        self._servers = [RedisServer(port=master_port, config=_DATA_NODE_CONFIG)]
        self._servers += [
            # In the config file, not on the command line: Sentinel's CONFIG REWRITE of a
            # reconfigured replica must survive a restart, as in a deployment.
            RedisServer(port=port, config=f"{_DATA_NODE_CONFIG}replicaof {_HOST} {master_port}\n")
            for port in replica_ports
        ]
        quorum = sentinels // 2 + 1
        sentinel_config = (
            f"sentinel monitor {master_name} {_HOST} {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
            f"sentinel failover-timeout {master_name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {master_name} {max(replicas, 1)}\n"
        )
        self._sentinels = [
            RedisServer(port=port, config=sentinel_config, sentinel=True) for port in sentinel_ports
        ]

    @property
    def master_name(self) -> str:
        """The name the Sentinels monitor the master under."""
        return self._master_name

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The Sentinels' (host, port) pairs, as redis-py's ``Sentinel`` takes them."""
        return [(_HOST, sentinel.port) for sentinel in self._sentinels]

    @property
    def url(self) -> str:
        """A ``redis+sentinel://`` URL for database 0 of the monitored master."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self._master_name}/0"

    @property
    def servers(self) -> tuple[RedisServer, ...]:
        """Every data node, whatever its current role."""
        return tuple(self._servers)

    @property
    def sentinels(self) -> tuple[RedisServer, ...]:
        """The Sentinel processes."""
        return tuple(self._sentinels)

    def start(self) -> None:
        """Start the data nodes, then the Sentinels; return once a failover could happen.

        That is: every replica is in sync, and every Sentinel knows the master, every replica
        and every other Sentinel. If anything fails, everything started is stopped first.
        """
        began = time.monotonic()
        try:
            for server in self._servers:
                server.start()
            master = self._servers[0]
            _poll(
                lambda: all(_in_sync_replica_of(s, master) for s in self._servers[1:]) or None,
                timeout=self._start_timeout,
                what="replicas in sync with the master",
                logs=self._logs,
            )
            for sentinel in self._sentinels:
                sentinel.start()
            _poll(
                lambda: all(self._sentinel_ready(s, master) for s in self._sentinels) or None,
                timeout=self._start_timeout,
                what="Sentinels aware of the master, its replicas and each other",
                logs=self._logs,
            )
        except BaseException:
            self.stop()
            raise
        logger.info("Sentinel group ready in %.2f s: %s", time.monotonic() - began, self.url)

    def stop(self) -> None:
        """Stop the Sentinels (so none fails over meanwhile), then the data nodes; idempotent."""
        _stop_all([*self._sentinels, *self._servers])

    def master(self) -> RedisServer:
        """The data node the first answering Sentinel names as master."""
        for sentinel in self._sentinels:
            if not sentinel.running:
                continue
            try:
                return self._server_on(self._master_port(sentinel))
            except (OSError, resp.ReplyError):
                continue
        raise RuntimeError("no Sentinel answered GET-MASTER-ADDR-BY-NAME")

    def replicas(self) -> list[RedisServer]:
        """The running data nodes that currently report the replica role."""
        found = []
        for server in self._servers:
            try:
                if server.running and _replication(server).get("role") == "slave":
                    found.append(server)
            except (OSError, resp.ReplyError):
                continue
        return found

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master, as a crash would, and return it."""
        master = self.master()
        master.kill()
        return master

    def wait_for_new_master(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Block until every running Sentinel names one other node as master, and that node
        reports the master role; return it."""

        def promoted() -> RedisServer | None:
            ports = {self._master_port(s) for s in self._sentinels if s.running}
            if len(ports) != 1 or old.port in ports:
                return None
            server = self._server_on(ports.pop())
            return server if _replication(server).get("role") == "master" else None

        return _poll(promoted, timeout=timeout, what="a new master", logs=self._logs)

    def failover(self) -> RedisServer:
        """Ask a Sentinel for a failover (`SENTINEL FAILOVER`, as an operator or a rolling
        update does) and return the master it replaces, which stays up and writable until
        Sentinel turns it into a replica."""
        old = self.master()
        for sentinel in self._sentinels:
            if sentinel.running:
                resp.call(sentinel.port, "SENTINEL", "FAILOVER", self._master_name)
                return old
        raise RuntimeError("no Sentinel is running")

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start a stopped data node again and block until it is an in-sync replica of the
        current master that every Sentinel sees up.

        A former master comes back as a master; Sentinel turns it into a replica only after
        it has reported the wrong role for 8 s, so this takes that long.
        """
        server.start()
        self.wait_rejoined(server, timeout)

    def wait_rejoined(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Block until a running data node is an in-sync replica of the current master that
        every Sentinel sees up (a former master that stayed up, after a failover)."""

        def rejoined() -> bool | None:
            if not _in_sync_replica_of(server, self.master()):
                return None
            for sentinel in self._sentinels:
                replicas = self._sentinel_replicas(sentinel)
                if replicas.get(server.port) != "slave":
                    return None
            return True

        _poll(rejoined, timeout=timeout, what=f"{server!r} back as a replica", logs=self._logs)

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

    def _master_port(self, sentinel: RedisServer) -> int:
        reply = resp.array(
            resp.call(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._master_name)
        )
        return int(resp.text(reply[1]))

    def _sentinel_replicas(self, sentinel: RedisServer) -> dict[int, str]:
        """The replicas one Sentinel knows, as port -> flags (``slave`` when healthy)."""
        reply = resp.call(sentinel.port, "SENTINEL", "REPLICAS", self._master_name)
        known = [resp.pairs(item) for item in resp.array(reply)]
        return {int(replica["port"]): replica["flags"] for replica in known}

    def _sentinel_ready(self, sentinel: RedisServer, master: RedisServer) -> bool:
        if self._master_port(sentinel) != master.port:
            return False
        replicas = self._sentinel_replicas(sentinel)
        expected = {server.port: "slave" for server in self._servers[1:]}
        if replicas != expected:
            return False
        reply = resp.call(sentinel.port, "SENTINEL", "SENTINELS", self._master_name)
        return len(resp.array(reply)) == len(self._sentinels) - 1

    def _server_on(self, port: int) -> RedisServer:
        for server in self._servers:
            if server.port == port:
                return server
        raise RuntimeError(f"no data node of this group listens on port {port}")

    def _logs(self) -> str:
        return _log_tails([*self._servers, *self._sentinels])


@dataclass(frozen=True, slots=True)
class ClusterShard:
    """A cluster master with the slot ranges (inclusive) it serves and its replicas."""

    master: RedisServer
    node_id: str
    slots: tuple[tuple[int, int], ...]
    replicas: tuple[RedisServer, ...]

    @property
    def slot_count(self) -> int:
        """How many of the 16384 slots this master serves."""
        return sum(last - first + 1 for first, last in self.slots)

    def serves(self, slot: int) -> bool:
        """Whether ``slot`` is in one of this master's ranges."""
        return any(first <= slot <= last for first, last in self.slots)


@dataclass(frozen=True, slots=True)
class _NodeEntry:
    """One line of CLUSTER NODES: what one node believes about one node."""

    node_id: str
    port: int
    is_master: bool
    master_id: str
    slots: tuple[tuple[int, int], ...]
    failing: bool


def _slot_range(field: str) -> tuple[int, int]:
    first, _, last = field.partition("-")
    return int(first), int(last or first)


def _cluster_nodes(server: RedisServer) -> list[_NodeEntry]:
    entries = []
    for line in resp.text(resp.call(server.port, "CLUSTER", "NODES")).splitlines():
        node_id, address, flags, master_id, *rest = line.split()
        flag_set = set(flags.split(","))
        entries.append(
            _NodeEntry(
                node_id=node_id,
                port=int(address.partition("@")[0].rpartition(":")[2]),
                is_master="master" in flag_set,
                master_id=master_id,
                # rest[4:] are the slots; "[slot->-id]" marks a migration, not ownership.
                slots=tuple(_slot_range(f) for f in rest[4:] if not f.startswith("[")),
                failing=bool(flag_set & {"fail", "fail?"}),
            )
        )
    return entries


def _consensus_view(entries: list[_NodeEntry]) -> frozenset[_NodeEntry]:
    """The part of a node's view that every node must agree on; failure flags spread by gossip
    at their own pace and are left out."""
    return frozenset(
        _NodeEntry(e.node_id, e.port, e.is_master, e.master_id, e.slots, failing=False)
        for e in entries
    )


class ClusterGroup:
    """A Redis Cluster of throwaway processes: masters with replicas, made by redis-cli."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1000,
        start_timeout: float = 30.0,
    ) -> None:
        self._replicas_per_master = replicas_per_master
        self._start_timeout = start_timeout
        config = (
            f"{_DATA_NODE_CONFIG}"
            "cluster-enabled yes\n"
            # Relative to the node's data directory, where the server runs.
            "cluster-config-file nodes.conf\n"
            f"cluster-node-timeout {node_timeout_ms}\n"
        )
        count = masters * (1 + replicas_per_master)
        self._nodes = [
            RedisServer(port=port, config=config) for port in _free_ports(count, cluster_bus=True)
        ]
        self._slots_at_kill: dict[int, tuple[tuple[int, int], ...]] = {}

    @property
    def nodes(self) -> tuple[RedisServer, ...]:
        """Every node, whatever its current role."""
        return tuple(self._nodes)

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL naming every current master as a seed."""
        seeds = ",".join(f"{_HOST}:{shard.master.port}" for shard in self.masters())
        return f"redis+cluster://{seeds}"

    def start(self) -> None:
        """Start the nodes, create the cluster and return once it is healthy: every running
        node reports cluster_state:ok, agrees on slots and roles, and every replica is in sync.
        If anything fails, everything started is stopped first."""
        began = time.monotonic()
        try:
            for node in self._nodes:
                node.start()
            self._create()
            self._wait_healthy(self._start_timeout, what="a healthy new cluster")
        except BaseException:
            self.stop()
            raise
        logger.info("Cluster ready in %.2f s: %s", time.monotonic() - began, self.url)

    def stop(self) -> None:
        """Stop every node and delete its data; idempotent."""
        _stop_all(self._nodes)

    def masters(self) -> list[ClusterShard]:
        """The masters serving slots, as the first answering node sees them, by first slot."""
        for node in self._nodes:
            if not node.running:
                continue
            try:
                entries = _cluster_nodes(node)
            except (OSError, resp.ReplyError):
                continue
            return self._shards(entries)
        raise RuntimeError("no cluster node answered CLUSTER NODES")

    def master_for_slot(self, slot: int) -> RedisServer:
        """The master serving ``slot``."""
        for shard in self.masters():
            if shard.serves(slot):
                return shard.master
        raise ValueError(f"no master serves slot {slot}")

    def slot_for_key(self, key: str) -> int:
        """The slot of ``key`` (hash tags included), as the cluster computes it."""
        node = next(node for node in self._nodes if node.running)
        reply = resp.call(node.port, "CLUSTER", "KEYSLOT", key)
        if not isinstance(reply, int):
            raise TypeError(f"expected an integer reply, got {reply!r}")
        return reply

    def kill(self, node: RedisServer) -> None:
        """SIGKILL one node, as a crash would."""
        for shard in self.masters():
            if shard.master is node:
                self._slots_at_kill[node.port] = shard.slots
        node.kill()

    def wait_for_failover(self, old_master: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Block until another node serves the slots ``old_master`` served when ``kill`` stopped
        it and the cluster is healthy again; return the new master."""
        slots = self._slots_at_kill.get(old_master.port)
        if not slots:
            raise ValueError(f"{old_master!r} served no slots when kill() stopped it")

        def promoted() -> RedisServer | None:
            entries = self._healthy_view()
            if entries is None:
                return None
            new = self._shard_serving(entries, slots[0][0]).master
            if new is old_master or _replication(new).get("role") != "master":
                return None
            return new

        return _poll(promoted, timeout=timeout, what="a failover", logs=self._logs)

    def restart(self, node: RedisServer, timeout: float = 30.0) -> None:
        """Start a stopped node again and block until the cluster is healthy with it; a former
        master comes back as a replica of the node that took over its slots."""
        node.start()
        self._slots_at_kill.pop(node.port, None)
        self._wait_healthy(timeout, what=f"{node!r} back in the cluster")

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

    def _create(self) -> None:
        args = [
            redis_cli_binary(),
            "--cluster", "create",
            *(f"{_HOST}:{node.port}" for node in self._nodes),
            "--cluster-replicas", str(self._replicas_per_master),
            "--cluster-yes",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self._start_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(
                f"redis-cli --cluster create did not finish within {self._start_timeout:.0f}s\n"
                f"{self._logs()}"
            ) from e
        if result.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({result.returncode})\n"
                f"{result.stdout}{result.stderr}\n{self._logs()}"
            )

    def _wait_healthy(self, timeout: float, *, what: str) -> None:
        _poll(self._healthy_view, timeout=timeout, what=what, logs=self._logs)

    def _healthy_view(self) -> list[_NodeEntry] | None:
        """The cluster's config if every running node reports cluster_state:ok, all agree on it,
        none is flagged as failing and every running replica is in sync; else None."""
        running = [node for node in self._nodes if node.running]
        views = set()
        entries: list[_NodeEntry] = []
        for node in running:
            info = resp.fields(resp.call(node.port, "CLUSTER", "INFO"))
            if info.get("cluster_state") != "ok":
                return None
            entries = _cluster_nodes(node)
            views.add(_consensus_view(entries))
            running_ports = {n.port for n in running}
            if any(e.failing and e.port in running_ports for e in entries):
                return None
            replication = _replication(node)
            if replication.get("role") == "slave" and (
                replication.get("master_link_status") != "up"
            ):
                return None
        if len(views) != 1 or len(entries) != len(self._nodes):
            return None
        return entries

    def _shards(self, entries: list[_NodeEntry]) -> list[ClusterShard]:
        shards = [
            ClusterShard(
                master=self._node_on(e.port),
                node_id=e.node_id,
                slots=e.slots,
                replicas=tuple(
                    self._node_on(r.port)
                    for r in entries
                    if not r.is_master and r.master_id == e.node_id
                ),
            )
            for e in entries
            if e.is_master and e.slots
        ]
        return sorted(shards, key=lambda shard: shard.slots[0])

    def _shard_serving(self, entries: list[_NodeEntry], slot: int) -> ClusterShard:
        for shard in self._shards(entries):
            if shard.serves(slot):
                return shard
        raise ValueError(f"no master serves slot {slot}")

    def _node_on(self, port: int) -> RedisServer:
        for node in self._nodes:
            if node.port == port:
                return node
        raise RuntimeError(f"no node of this cluster listens on port {port}")

    def _logs(self) -> str:
        return _log_tails(self._nodes)
