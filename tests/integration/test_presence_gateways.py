"""Viewer counts across `eco-router serve` processes on real Redis: the console's job lookup
sums every gateway's viewers of the job, and a gateway's share leaves with it, at once when it
stops, within a few periods when it is killed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from eco_router.testing import RedisServer
from tests.integration.sse_client import SseStream, open_sse, sse_client
from tests.integration.support import add_event, eventually
from tests.integration.test_gateway import Gateway, Gateways

JOB = "presence-job-1"
# Quick posts for the gateway that is killed: its counts lapse 3 periods (0.6 s) after its last.
QUICK = {"EVENT_ROUTER_PRESENCE_INTERVAL_S": "0.2"}
# A period far beyond the test: a share gone within it was removed by a clean stop.
SLOW = {"EVENT_ROUTER_PRESENCE_INTERVAL_S": "120"}


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    launcher = Gateways(tmp_path)
    yield launcher
    launcher.stop_all()


@contextlib.asynccontextmanager
async def watching(gateway: Gateway, count: int) -> AsyncIterator[list[SseStream]]:
    """`count` viewers of the job's stream on `gateway`, each having had its first event."""
    async with sse_client(gateway.base_url) as client, contextlib.AsyncExitStack() as stack:
        streams = [
            await stack.enter_async_context(open_sse(client, f"/api/v1/scan/{JOB}/events"))
            for _ in range(count)
        ]
        for stream in streams:
            assert stream.status_code == 200
            await stream.read(1)
        yield streams


async def viewers(console: Gateway) -> Any:
    async with httpx.AsyncClient(base_url=console.base_url, trust_env=False) as client:
        found = await client.get(f"/console/api/jobs/scan/{JOB}")
    return found.json()["viewers"] if found.status_code == 200 else None


async def viewers_become(console: Gateway, by_gateway: dict[str, int]) -> None:
    expected = {"total": sum(by_gateway.values()), "by_gateway": by_gateway}

    async def matches() -> bool:
        return await viewers(console) == expected

    await eventually(matches, timeout_s=10, what=f"viewers {expected}")


class TestViewersAcrossGateways:
    async def test_the_lookup_sums_the_gateways_and_a_gateway_that_leaves_takes_its_share(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        streams_redis: Redis,
    ) -> None:
        urls = {"streams_url": streams_server.url, "pubsub_url": pubsub_server.url}
        console = gateways.start(
            **urls,
            EVENT_ROUTER_CONSUMER_NAME="gateway-a",
            EVENT_ROUTER_CONSOLE="true",
            EVENT_ROUTER_GATEWAY_METRICS="true",
            **QUICK,
        )
        killed = gateways.start(
            **urls, no_router=True, EVENT_ROUTER_CONSUMER_NAME="gateway-b", **QUICK
        )
        stopped = gateways.start(
            **urls, no_router=True, EVENT_ROUTER_CONSUMER_NAME="gateway-c", **SLOW
        )
        await add_event(streams_redis, JOB, 10, stage="vision", status="started")
        await eventually(lambda: viewers(console), what="the job routed")

        async with watching(console, 2), watching(killed, 1), watching(stopped, 3):
            await viewers_become(console, {"gateway-a": 2, "gateway-b": 1, "gateway-c": 3})
            assert await console.metric("event_router_gateway_viewers", domain="scan") == 2
            assert await console.metric("event_router_gateway_jobs_watched", domain="scan") == 1

            stopped.stop()
            await viewers_become(console, {"gateway-a": 2, "gateway-b": 1})

            killed.kill()
            await viewers_become(console, {"gateway-a": 2})

        await viewers_become(console, {})
