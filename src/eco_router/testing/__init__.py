"""Test and benchmark helpers: throwaway infrastructure that never touches shared servers."""

from eco_router.testing.redis_server import RedisServer, redis_cli_binary, redis_server_binary
from eco_router.testing.topologies import ClusterGroup, ClusterShard, SentinelGroup

__all__ = [
    "ClusterGroup",
    "ClusterShard",
    "RedisServer",
    "SentinelGroup",
    "redis_cli_binary",
    "redis_server_binary",
]
