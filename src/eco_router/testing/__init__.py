"""Test and benchmark helpers: throwaway infrastructure that never touches shared servers."""

from eco_router.testing.redis_server import RedisServer, redis_server_binary

__all__ = ["RedisServer", "redis_server_binary"]
