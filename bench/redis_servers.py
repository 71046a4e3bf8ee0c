"""The two throwaway redis-servers a benchmark runs against: one for streams, one for Pub/Sub."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from eco_router.testing import RedisServer


@contextmanager
def redis_servers(
    pubsub_args: tuple[str, ...] = (),
) -> Iterator[tuple[RedisServer, RedisServer]]:
    """Start (streams, Pub/Sub) on free loopback ports; remove both on the way out."""
    streams, pubsub = RedisServer(), RedisServer(extra_args=pubsub_args)
    try:
        streams.start()
        pubsub.start()
        yield streams, pubsub
    finally:
        streams.cleanup()
        pubsub.cleanup()
