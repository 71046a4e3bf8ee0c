"""The router's KEDA query, read from its ScaledObject, asked of a real Prometheus scraping real
workers: it returns the group's backlog once, however many routers report it."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from eco_router.testing import RedisServer
from tests.deploy.monitoring_support import (
    ROUTER_SCALER,
    free_port,
    prometheus_config,
    prometheus_tool,
    scaler_query,
)
from tests.integration.support import (
    CHAT,
    SCAN,
    WorkerProcess,
    Workers,
    add_event,
    eventually,
)

pytestmark = pytest.mark.integration

BACKLOG = 37


class Prometheus:
    """prometheus (`make prometheus` extracts it into .tools/) on a loopback port, with its
    config and storage in a temp dir."""

    def __init__(self, directory: Path, config: str) -> None:
        binary = Path(prometheus_tool("prometheus"))
        assert binary.is_file(), "prometheus is missing: `make prometheus` installs it"
        (directory / "prometheus.yml").write_text(config)
        self.base_url = f"http://127.0.0.1:{free_port()}"
        self.log_path = directory / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={directory / 'prometheus.yml'}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address={self.base_url.removeprefix('http://')}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    async def until_ready(self) -> None:
        async def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()}")
            try:
                async with httpx.AsyncClient(timeout=2, trust_env=False) as client:
                    return (await client.get(f"{self.base_url}/-/ready")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, timeout_s=30, what="prometheus ready")

    async def value(self, query: str) -> float | None:
        """The query's single value now, None while it has no result."""
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            response = await client.get(f"{self.base_url}/api/v1/query", params={"query": query})
        body = response.json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def workers(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> Iterator[Workers]:
    launcher = Workers(tmp_path, streams_url=streams_server.url, pubsub_url=pubsub_server.url)
    yield launcher
    # SIGKILL ends a stopped process too.
    launcher.kill_all()


async def standbys_over_a_frozen_holder(
    workers: Workers, streams_redis: Redis
) -> list[WorkerProcess]:
    """Two routers that hold no shard: the first router holds them all, with a 10-minute
    lease, and is stopped (SIGSTOP). Nothing reads the streams; the two standbys still
    report every shard's lag and pending."""
    holder = await workers.start(EVENT_ROUTER_LEASE_TTL_MS="600000")
    await add_event(streams_redis, "scan-warm", 1)
    await add_event(streams_redis, "chat-warm", 1, family=CHAT)
    await holder.metric_reaching("event_router_published_total", 2)
    await holder.metric_reaching("event_router_shard_held", 6)
    holder.process.send_signal(signal.SIGSTOP)
    standbys = [await workers.start(), await workers.start()]
    for standby in standbys:
        assert await standby.metric("event_router_shard_held") == 0
    return standbys


class TestRouterScalerQuery:
    async def test_it_returns_the_backlog_once_with_two_routers_reporting_it(
        self, tmp_path: Path, workers: Workers, streams_redis: Redis
    ) -> None:
        standbys = await standbys_over_a_frozen_holder(workers, streams_redis)
        for n in range(BACKLOG):
            family = SCAN if n % 3 else CHAT
            await add_event(streams_redis, f"{family.domain}-{n}", 1, family=family)
        targets = [s.base_url.removeprefix("http://") for s in standbys]
        prometheus = Prometheus(
            tmp_path, prometheus_config({"router": targets}, namespace="eco-router")
        )
        try:
            await prometheus.until_ready()
            naive_query = 'sum(event_router_consumer_lag{namespace="eco-router", job="router"})'

            async def both_reporting() -> float | None:
                value = await prometheus.value(naive_query)
                return value if value == 2 * BACKLOG else None

            try:
                await eventually(both_reporting, timeout_s=30, every_s=0.5, what="both scraped")
            except AssertionError as error:
                raise AssertionError(f"{error}\n{prometheus.log_path.read_text()}") from None
            scaled_on = await prometheus.value(scaler_query(ROUTER_SCALER))
        finally:
            prometheus.stop()

        assert scaled_on == BACKLOG
