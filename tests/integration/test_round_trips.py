"""A pipeline's commands on a kept connection: the same replies as through the pool, and no
reply of an interrupted round trip ever read as the next one's."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.adapters.redis.connections.connection import redis_client
from eco_router.adapters.redis.connections.round_trips import HeldConnection
from eco_router.testing import RedisServer
from eco_router.testing.topologies import SentinelGroup

# Sentinel notices a dead master after 1 s (the fixture's down-after) and promotes a replica.
FAILOVER_TIMEOUT_S = 30.0


def queue_mixed(pipe: object) -> None:
    """Commands with reply callbacks, an error in the middle, and a script-free tail."""
    pipe.set("k", "v")  # type: ignore[attr-defined]
    pipe.xadd("s", {"f": "1"}, id="1-0")  # type: ignore[attr-defined]
    pipe.lpush("k", "x")  # type: ignore[attr-defined]  # WRONGTYPE
    pipe.xrange("s")  # type: ignore[attr-defined]
    pipe.get("k")  # type: ignore[attr-defined]


async def test_replies_are_those_the_pool_gives(streams_redis: Redis) -> None:
    held = HeldConnection(streams_redis)
    async with streams_redis.pipeline(transaction=False) as pipe:
        queue_mixed(pipe)
        kept = await held.execute(pipe)
    await streams_redis.delete("k", "s")
    async with streams_redis.pipeline(transaction=False) as pipe:
        queue_mixed(pipe)
        pooled = await pipe.execute(raise_on_error=False)

    assert isinstance(kept[2], ResponseError)
    assert isinstance(pooled[2], ResponseError)
    assert str(kept[2]) == str(pooled[2])
    assert kept[:2] + kept[3:] == pooled[:2] + pooled[3:]
    assert kept[3] == [(b"1-0", {b"f": b"1"})]


async def test_every_round_trip_goes_on_the_same_connection(streams_redis: Redis) -> None:
    held = HeldConnection(streams_redis)
    ids = []
    for _ in range(3):
        async with streams_redis.pipeline(transaction=False) as pipe:
            pipe.client_id()
            (client_id,) = await held.execute(pipe)
            ids.append(client_id)
    assert len(set(ids)) == 1


async def test_a_round_trip_cancelled_midway_leaves_no_reply_for_the_next(
    streams_redis: Redis,
) -> None:
    held = HeldConnection(streams_redis)
    async with streams_redis.pipeline(transaction=False) as pipe:
        pipe.xread({"s": "$"}, block=5_000)
        blocked = asyncio.create_task(held.execute(pipe))
        await _until_blocked(streams_redis)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
    # The entry that would have answered the cancelled read arrives now.
    await streams_redis.xadd("s", {"late": "1"})

    async with streams_redis.pipeline(transaction=False) as pipe:
        pipe.get("k")
        pipe.ping()
        assert await held.execute(pipe) == [None, True]


async def test_a_round_trip_its_caller_cancels_is_not_taken_for_a_timeout(
    streams_server: RedisServer,
) -> None:
    client, _ = redis_client(streams_server.url, socket_timeout_s=5.0, client_name="test")
    assert isinstance(client, Redis)
    held = HeldConnection(client)
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.xread({"s": "$"}, block=5_000)
            blocked = asyncio.create_task(held.execute(pipe))
            await _until_blocked(client)
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
        # Nor does a deadline left behind cancel what the caller does next.
        await asyncio.sleep(0)
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_a_restarted_server_is_reconnected_to(streams_server: RedisServer) -> None:
    # The router's client: its connections retry once after a connection error.
    client, _ = redis_client(streams_server.url, socket_timeout_s=5, client_name="test")
    assert isinstance(client, Redis)
    held = HeldConnection(client)
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.set("k", "before")
            await held.execute(pipe)
        streams_server.restart()
        async with client.pipeline(transaction=False) as pipe:
            pipe.set("k", "after")
            pipe.get("k")
            assert await held.execute(pipe) == [True, b"after"]
    finally:
        await client.aclose()


async def test_behind_sentinel_a_killed_master_is_left_for_the_promoted_one() -> None:
    with SentinelGroup() as group:
        client, sentinels = redis_client(group.url, socket_timeout_s=5, client_name="test")
        assert isinstance(client, Redis)
        held = HeldConnection(client)
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.set("k", "before")
                await held.execute(pipe)
            old = group.kill_master()
            new = await asyncio.to_thread(group.wait_for_new_master, old, FAILOVER_TIMEOUT_S)
            # Round trips fail while the address the sentinels give is the dead one's.
            for _ in range(int(FAILOVER_TIMEOUT_S * 10)):
                async with client.pipeline(transaction=False) as pipe:
                    pipe.set("k", "after")
                    pipe.config_get("port")
                    try:
                        replies = await held.execute(pipe)
                        break
                    except ConnectionError:
                        await asyncio.sleep(0.1)
            else:
                raise AssertionError("no round trip reached the promoted master")
        finally:
            await client.aclose()
            for sentinel in sentinels:
                await sentinel.aclose()

    assert replies[0] is True
    assert int(next(iter(replies[1].values()))) == new.port


async def test_a_server_that_stops_answering_times_the_round_trip_out(
    streams_server: RedisServer,
) -> None:
    client, _ = redis_client(streams_server.url, socket_timeout_s=0.5, client_name="test")
    assert isinstance(client, Redis)
    held = HeldConnection(client)
    pid = streams_server.pid
    assert pid is not None
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.set("k", "before")
            await held.execute(pipe)
        os.kill(pid, signal.SIGSTOP)
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.get("k")
                with pytest.raises(RedisTimeoutError):
                    await held.execute(pipe)
        finally:
            os.kill(pid, signal.SIGCONT)
        async with client.pipeline(transaction=False) as pipe:
            pipe.get("k")
            pipe.ping()
            assert await held.execute(pipe) == [b"before", True]
    finally:
        await client.aclose()


async def test_a_script_the_server_lost_is_loaded_again(streams_redis: Redis) -> None:
    held = HeldConnection(streams_redis)
    script = streams_redis.register_script("return redis.call('INCR', KEYS[1]) + ARGV[1]")
    assert await held.call_script(script, ["n"], [10]) == 11
    await streams_redis.script_flush()
    assert await held.call_script(script, ["n"], [10]) == 12


async def test_a_script_error_is_raised(streams_redis: Redis) -> None:
    held = HeldConnection(streams_redis)
    script = streams_redis.register_script("return redis.call('LPUSH', KEYS[1], 'x')")
    await streams_redis.set("k", "v")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await held.call_script(script, ["k"], [])


async def _until_blocked(redis: Redis) -> None:
    for _ in range(500):
        if (await redis.info("clients"))["blocked_clients"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the read never blocked")
