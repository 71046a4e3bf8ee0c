"""The RedisServer helper against a real redis-server binary."""

import pytest
import redis.exceptions
from redis.asyncio import Redis

from eco_router.testing import RedisServer


class TestRedisServer:
    async def test_a_started_server_stores_and_returns_values(self, streams_redis: Redis) -> None:
        await streams_redis.set("job:1", "running")

        assert await streams_redis.get("job:1") == b"running"

    async def test_restart_with_appendonly_keeps_data(self) -> None:
        with RedisServer(appendonly=True) as server:
            before = Redis.from_url(server.url)
            await before.set("job:1", "done")
            await before.aclose()
            port = server.port

            server.restart()

            after = Redis.from_url(server.url)
            try:
                assert server.port == port
                assert await after.get("job:1") == b"done"
            finally:
                await after.aclose()

    async def test_a_killed_server_refuses_connections(
        self, streams_server: RedisServer, streams_redis: Redis
    ) -> None:
        assert await streams_redis.ping()

        streams_server.kill()

        assert not streams_server.running
        assert streams_server.pid is None
        with pytest.raises(redis.exceptions.ConnectionError):
            await streams_redis.ping()

    def test_two_servers_listen_on_different_ports(
        self, streams_server: RedisServer, pubsub_server: RedisServer
    ) -> None:
        assert streams_server.running
        assert pubsub_server.running
        assert streams_server.port != pubsub_server.port
        assert streams_server.pid != pubsub_server.pid

    def test_stop_is_idempotent_and_cleanup_removes_the_data_dir(self) -> None:
        server = RedisServer()
        server.start()
        data_dir = server.data_dir

        server.stop()
        server.stop()
        server.cleanup()

        assert not server.running
        assert data_dir is not None
        assert not data_dir.exists()

    def test_a_bad_argument_fails_start_with_the_log_tail(self) -> None:
        server = RedisServer(extra_args=["--no-such-directive", "1"])
        try:
            with pytest.raises(RuntimeError, match="no-such-directive"):
                server.start()
            assert not server.running
        finally:
            server.cleanup()
