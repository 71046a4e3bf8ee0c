"""Blocking reads where an ACL forbids CLIENT UNBLOCK or CLIENT ID: the source stops blocking
on the server (its blocking reads wait for appends with XREAD instead) and loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.connections.connection import open_pinned_reader, open_redis
from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
from eco_router.application.errors import PermanentError
from eco_router.domain.streams import StreamFamily
from eco_router.testing import RedisServer

FAMILY = StreamFamily("scan:events", 2)
AFTER = dict.fromkeys(FAMILY.streams, "0-0")


@contextlib.asynccontextmanager
async def limited_source(
    server: RedisServer, admin: Redis, forbidden: str
) -> AsyncIterator[RedisStreamEventSource]:
    """A source connected as a user allowed everything but `forbidden`."""
    await admin.acl_setuser(
        "router", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
        commands=["+@all", f"-{forbidden}"],
    )  # fmt: skip
    url = f"redis://router:secret@127.0.0.1:{server.port}/0"
    async with (
        open_redis(url, socket_timeout_s=10.0, client_name="router") as redis,
        open_pinned_reader(url, socket_timeout_s=10.0, client_name="reader") as reader,
    ):
        source = RedisStreamEventSource(
            redis, families=[FAMILY], group="router", consumer="a", reader=reader
        )
        await source.prepare()
        yield source


async def test_without_client_unblock_the_read_ends_by_its_block_and_reads_stop_blocking(
    streams_server: RedisServer, streams_redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    async with limited_source(streams_server, streams_redis, "client|unblock") as source:
        assert source.can_block
        reading = asyncio.ensure_future(source.read_new(AFTER, count=10, block_ms=300))
        await asyncio.sleep(0.05)

        with pytest.raises(PermanentError, match="CLIENT UNBLOCK"):
            await source.interrupt()
        async with asyncio.timeout(5):
            assert (await reading).deliveries == []

        assert not source.can_block
        assert "blocking reads are off" in caplog.text
        written = await streams_redis.xadd(FAMILY.streams[0], {"job_id": "j", "seq": "1"})
        read = await source.read_new(AFTER, count=10, block_ms=30_000)
        assert [d.entry_id for d in read.deliveries] == [written.decode()]


async def test_without_client_id_reads_stop_blocking_after_the_first_connection(
    streams_server: RedisServer, streams_redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with limited_source(streams_server, streams_redis, "client|id") as source:
        async with asyncio.timeout(5):
            await source.read_new(AFTER, count=10, block_ms=50)

        assert not source.can_block
        assert "blocking reads are off" in caplog.text
        reading = asyncio.ensure_future(source.read_new(AFTER, count=10, block_ms=30_000))
        await asyncio.sleep(0.1)
        assert not reading.done()
        written = await streams_redis.xadd(FAMILY.streams[1], {"job_id": "j", "seq": "1"})
        async with asyncio.timeout(5):
            assert [d.entry_id for d in (await reading).deliveries] == [written.decode()]
