"""Every metric the alerts, the dashboard and the autoscalers query is one the real processes
expose: a worker and a gateway on real Redis servers, after real traffic."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from eco_router.testing import RedisServer
from tests.deploy.monitoring_support import (
    PROMETHEUS_MADE,
    GatewayProcess,
    all_queries,
    exposed_names,
    used_metrics,
)
from tests.integration.support import (
    SCAN,
    WorkerProcess,
    Workers,
    add_event,
    add_raw,
    eventually,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def workers(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> Iterator[Workers]:
    launcher = Workers(tmp_path, streams_url=streams_server.url, pubsub_url=pubsub_server.url)
    yield launcher
    launcher.kill_all()


@pytest.fixture
async def gateway(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> AsyncIterator[GatewayProcess]:
    process = GatewayProcess(streams_server.url, pubsub_server.url, tmp_path / "gateway.log")
    try:
        await process.until_ready()
        yield process
    finally:
        process.stop()


async def watch_to_the_end(gateway: GatewayProcess, job_id: str) -> str:
    """One SSE stream of the job, read until the gateway ends it."""
    url = f"{gateway.base_url}/api/v1/scan/{job_id}/events"
    async with (
        httpx.AsyncClient(timeout=20, trust_env=False) as client,
        client.stream("GET", url) as response,
    ):
        assert response.status_code == 200
        return "".join([chunk async for chunk in response.aiter_text()])


@pytest.fixture
async def scrapes(
    workers: Workers, gateway: GatewayProcess, streams_redis: Redis
) -> dict[str, set[str]]:
    """The names each job's /metrics offers after routing, a dead letter and an SSE stream."""
    worker: WorkerProcess = await workers.start()
    for seq in range(1, 4):
        await add_event(streams_redis, "scan-watched", seq, stage="scanning", progress="10")
    await add_event(streams_redis, "scan-watched", 4, status="done")
    # No seq: judged invalid and dead-lettered.
    await add_raw(streams_redis, SCAN.stream_for("scan-bad"), {b"job_id": b"scan-bad"})
    await worker.metric_reaching("event_router_published_total", 4)
    await worker.metric_reaching("event_router_dead_letters_total", 1)
    # The job is done: its stream replays the history and ends.
    body = await watch_to_the_end(gateway, "scan-watched")
    assert "done" in body
    # The readiness gauges are set by each /ready, as the kubelet's probes ask it.
    assert (await worker.get("/ready")).status_code == 200
    assert (await gateway.get("/ready")).status_code == 200

    async def lag_reported() -> bool:
        return "event_router_consumer_lag{" in (await worker.get("/metrics")).text

    await eventually(lag_reported, what="lag observed")
    return {
        "router": exposed_names((await worker.get("/metrics")).text),
        "gateway": exposed_names((await gateway.get("/metrics")).text),
    }


class TestQueriedMetricsExist:
    async def test_every_metric_queried_by_the_kit_is_in_its_jobs_scrape(
        self, scrapes: dict[str, set[str]]
    ) -> None:
        missing: list[str] = []
        checked = 0
        for where, query in all_queries().items():
            for used in used_metrics(query, frozenset(scrapes)):
                checked += 1
                if used.name in PROMETHEUS_MADE:
                    continue
                found = [used.name in scrapes[job] for job in sorted(used.jobs)]
                if not (all(found) if used.every else any(found)) or not found:
                    missing.append(f"{where}: {used.name} (jobs {sorted(used.jobs)})")

        assert checked > 40
        assert missing == []

    async def test_the_gauges_alerts_read_are_exposed_by_the_right_process(
        self, scrapes: dict[str, set[str]]
    ) -> None:
        assert {"event_router_ready", "event_router_readiness_failing"} <= scrapes["router"]
        assert {
            "event_router_ready",
            "event_router_gateway_feed_failing",
            "event_router_gateway_connections_active",
        } <= scrapes["gateway"]
        assert "event_router_consumer_lag" not in scrapes["gateway"]

    def test_a_misspelt_name_would_be_caught(self) -> None:
        used = list(used_metrics('sum(event_router_lagg{job="router"})', frozenset({"router"})))

        assert [u.name for u in used] == ["event_router_lagg"]
        assert used[0].jobs == {"router"}
