"""RedisServer's config file and Sentinel mode, which the topology fixtures are built on."""

import redis

from eco_router.testing import RedisServer


def client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


class TestRedisServerConfigFile:
    def test_a_config_rewritten_by_the_server_survives_a_restart(self) -> None:
        with RedisServer(config="maxmemory 1mb\n") as server:
            with client(server) as r:
                assert r.config_get("maxmemory") == {"maxmemory": "1048576"}
                r.config_set("maxmemory", "2mb")
                r.config_rewrite()

            server.restart()

            with client(server) as r:
                assert r.config_get("maxmemory") == {"maxmemory": "2097152"}

    def test_a_sentinel_answers_sentinel_commands(self) -> None:
        with RedisServer(sentinel=True) as sentinel, client(sentinel) as r:
            assert r.execute_command("SENTINEL", "MASTERS") == []
