"""SentinelGroup and ClusterGroup against real redis-server processes."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator
from contextlib import closing

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError
from redis.sentinel import Sentinel

from eco_router.testing import ClusterGroup, RedisServer, SentinelGroup

# Failover needs about 3 s here; the margin is for a loaded machine.
FAILOVER_TIMEOUT_S = 30.0


def client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


def listening(servers: Iterable[RedisServer]) -> list[int]:
    """The ports of ``servers`` that still accept connections."""
    ports = []
    for server in servers:
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=0.5).close()
        except OSError:
            continue
        ports.append(server.port)
    return ports


@pytest.fixture(scope="module")
def sentinel_group() -> Iterator[SentinelGroup]:
    """A group the tests only read from and write to; failover tests start their own."""
    with SentinelGroup() as group:
        yield group


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterGroup]:
    """A cluster the tests only read from and write to; failover tests start their own."""
    with ClusterGroup() as group:
        yield group


class TestSentinelGroup:
    def test_every_sentinel_names_the_master_and_both_replicas(
        self, sentinel_group: SentinelGroup
    ) -> None:
        master = sentinel_group.master()
        replicas = sentinel_group.replicas()

        for address in sentinel_group.sentinel_addresses:
            sentinel = Sentinel([address], socket_timeout=5)
            try:
                name = sentinel_group.master_name
                assert sentinel.discover_master(name) == ("127.0.0.1", master.port)
                assert sorted(port for _, port in sentinel.discover_slaves(name)) == sorted(
                    replica.port for replica in replicas
                )
            finally:
                sentinel.close()
        assert len(replicas) == 2
        assert master not in replicas

    def test_url_names_every_sentinel_and_the_master(self, sentinel_group: SentinelGroup) -> None:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in sentinel_group.sentinels)

        assert sentinel_group.url == f"redis+sentinel://{hosts}/mymaster/0"

    def test_a_write_on_the_master_reaches_every_replica(
        self, sentinel_group: SentinelGroup
    ) -> None:
        with client(sentinel_group.master()) as master:
            master.set("job:1", "running")
            assert master.wait(2, 5000) == 2

        for replica in sentinel_group.replicas():
            with client(replica) as r:
                assert r.get("job:1") == b"running"

    def test_killing_the_master_promotes_a_replica_and_the_old_master_rejoins_as_one(
        self,
    ) -> None:
        with SentinelGroup() as group:
            replicas = group.replicas()

            old = group.kill_master()
            new = group.wait_for_new_master(old, timeout=FAILOVER_TIMEOUT_S)
            group.restart(old, timeout=FAILOVER_TIMEOUT_S)
            # On a loaded machine the new master can miss the 1 s down-after of the fixture,
            # and the Sentinels fail over once more, to the other replica.
            current = group.master()

            assert new in replicas
            assert current in replicas
            assert old in group.replicas()
            with client(current) as master:
                master.set("job:1", "after failover")
                assert master.wait(2, 5000) == 2
            with client(old) as rejoined:
                assert rejoined.get("job:1") == b"after failover"

    def test_a_group_that_fails_to_start_leaves_no_process_behind(self) -> None:
        # Sentinel refuses this setting, so the group fails after its data nodes are up.
        group = SentinelGroup(down_after_ms=0)

        with pytest.raises(RuntimeError, match="negative or zero time parameter"):
            group.start()

        assert listening([*group.servers, *group.sentinels]) == []


class TestClusterGroup:
    def test_every_node_reports_the_cluster_ok(self, cluster: ClusterGroup) -> None:
        for node in cluster.nodes:
            with client(node) as r:
                assert r.cluster("INFO")["cluster_state"] == "ok"

    def test_three_masters_share_the_slots_and_each_has_one_replica(
        self, cluster: ClusterGroup
    ) -> None:
        shards = cluster.masters()

        assert sorted(shard.slot_count for shard in shards) == [5461, 5461, 5462]
        assert [len(shard.replicas) for shard in shards] == [1, 1, 1]
        members = [node for shard in shards for node in (shard.master, *shard.replicas)]
        assert sorted(node.port for node in members) == sorted(n.port for n in cluster.nodes)

    def test_url_names_every_master_as_a_seed(self, cluster: ClusterGroup) -> None:
        seeds = ",".join(f"127.0.0.1:{shard.master.port}" for shard in cluster.masters())

        assert cluster.url == f"redis+cluster://{seeds}"

    def test_a_key_set_on_the_master_of_its_slot_is_readable_through_a_cluster_client(
        self, cluster: ClusterGroup
    ) -> None:
        key = "job:{42}:state"
        owner = cluster.master_for_slot(cluster.slot_for_key(key))
        other = next(s.master for s in cluster.masters() if s.master is not owner)

        with client(owner) as r:
            r.set(key, "running")
        with client(other) as r, pytest.raises(MovedError, match=f"127.0.0.1:{owner.port}$"):
            r.get(key)
        with closing(RedisCluster(host="127.0.0.1", port=other.port, socket_timeout=5)) as rc:
            assert rc.get(key) == b"running"

    def test_killing_a_master_promotes_its_replica_and_the_old_master_rejoins_as_its_replica(
        self,
    ) -> None:
        with ClusterGroup() as group:
            slots_before = [s.slots for s in group.masters()]
            shard = group.masters()[0]
            old = shard.master

            group.kill(old)
            new = group.wait_for_failover(old, timeout=FAILOVER_TIMEOUT_S)
            group.restart(old, timeout=FAILOVER_TIMEOUT_S)

            assert new in shard.replicas
            assert group.master_for_slot(shard.slots[0][0]) is new
            after = group.masters()
            assert [s.slots for s in after] == slots_before
            assert next(s for s in after if s.master is new).replicas == (old,)

    def test_a_cluster_that_fails_to_form_leaves_no_process_behind(self) -> None:
        # redis-cli refuses fewer than 3 masters, so this fails after every node is up.
        group = ClusterGroup(masters=2)

        with pytest.raises(RuntimeError, match="at least 3 master nodes"):
            group.start()

        assert listening(group.nodes) == []
