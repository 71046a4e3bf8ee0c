"""A short mixed soak: several kinds of fault in one run, beside hostile clients.

Paced load with malformed entries and retried ones runs throughout; hostile clients hold the
gateway all along (SSE streams they never read, request headers they never finish); meanwhile
the streams Redis runs out of memory for a while, and later the Pub/Sub Redis restarts. The
same checks as every scenario apply (nothing lost, in stream order; no duplicate to a client;
nothing stranded), and the scenario records each fault's time to recover and each process's
peak RSS. Every router runs with the documented defaults (only addresses and names are set).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from eco_router.testing import RedisServer
from tests.faults.conftest import OpenRig
from tests.faults.harness import FaultRig, Scenario, Sizes
from tests.faults.test_scenarios import fault_scenario
from tests.tcp_relay import Mode, TcpRelay

pytestmark = pytest.mark.integration

OOM_S = 5.0
PUBSUB_OUTAGE_S = 3.0
# Hostile clients of each kind; far fewer than a gateway's connection limits.
SILENT_READERS = 10
HALF_HEADERS = 10
# A receive buffer this small makes an unread stream back up into the gateway at once.
TINY_RECEIVE_BUFFER = 1024


class TestMixedSoak:
    @fault_scenario(
        10,
        "mixed-soak",
        "Bad entries, an out-of-memory streams Redis, a Pub/Sub restart and hostile clients "
        "together under paced load",
        Sizes("60x16", jobs=60, events=16, pace_s=0.2, malformed=0.05, duplicates=0.05, window=2),
    )
    async def test_nothing_is_lost_or_duplicated_when_faults_and_hostile_clients_mix(
        self,
        scenario: Scenario,
        open_rig: OpenRig,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
    ) -> None:
        async with TcpRelay(pubsub_server.port) as gate:
            rig = open_rig(scenario, router_pubsub_url=gate.url)
            rig.figures.params |= {
                "oom_s": OOM_S,
                "pubsub_outage_s": PUBSUB_OUTAGE_S,
                "hostile_clients": f"{SILENT_READERS} silent readers, {HALF_HEADERS} half headers",
            }
            await rig.start(workers=2)
            async with hostile_clients(rig.gateway.base_url, rig.load.jobs):
                await rig.start_load()
                await rig.load.until_routed(0.2)
                recoveries: dict[str, float] = {}

                async with out_of_memory(streams_server.url):
                    await asyncio.sleep(OOM_S)
                recoveries["out of memory"] = await rig.time_to_recover(time.monotonic())

                await rig.load.until_routed(0.5)
                gate.set_mode(Mode.HANG_UP)
                await asyncio.to_thread(pubsub_server.stop)
                await asyncio.sleep(PUBSUB_OUTAGE_S)
                await asyncio.to_thread(pubsub_server.start)
                await rig.collector.until_subscribed(2)
                gate.set_mode(Mode.PASS)
                rig.recover_from("the Pub/Sub restart")
                await rig.settle()

            recoveries["Pub/Sub restart"] = rig.figures.recovery_s
            rig.figures.params |= {
                "time_to_recover": [f"{name}: {s:.1f} s" for name, s in recoveries.items()],
                "peak_rss_mb": peak_rss_mb(rig),
            }
            rig.require(
                await rig.metric_sum("event_router_dead_letters_total", reason="max_deliveries")
                == 0,
                "a valid entry was dead-lettered during the out-of-memory episode",
            )
            rig.require(all(p.exit_code is None for p in rig.routers), "a router exited")
            rig.conclude()


@contextlib.asynccontextmanager
async def out_of_memory(url: str) -> AsyncIterator[None]:
    """The server refuses every write (`OOM command not allowed`) until the block ends."""
    admin = Redis.from_url(url)
    try:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", "1")
        yield
    finally:
        await admin.config_set("maxmemory", "0")
        await admin.aclose()


@contextlib.asynccontextmanager
async def hostile_clients(base_url: str, jobs: list[str]) -> AsyncIterator[None]:
    """SSE streams that are never read and requests whose headers never end, held open."""
    address = urlsplit(base_url)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    writers: list[asyncio.StreamWriter] = []
    for number in range(SILENT_READERS):
        job = jobs[number % len(jobs)]
        request = f"GET /api/v1/scan/{job}/events HTTP/1.1\r\nHost: {host}\r\n\r\n"
        writers.append(await _connect(host, port, request.encode()))
    for _ in range(HALF_HEADERS):
        writers.append(await _connect(host, port, b"GET /api/v1/scan/x/events HTTP/1.1\r\nHos"))
    try:
        yield
    finally:
        for writer in writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)


async def _connect(host: str, port: int, first_bytes: bytes) -> asyncio.StreamWriter:
    _, writer = await asyncio.open_connection(host, port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY_RECEIVE_BUFFER)
    writer.write(first_bytes)
    await writer.drain()
    return writer


def peak_rss_mb(rig: FaultRig) -> list[str]:
    """Each running router's peak resident set (VmHWM), in MB."""
    peaks = []
    for router in rig.routers:
        status = Path(f"/proc/{router.process.pid}/status").read_text()
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        peaks.append(f"{router.name}: {kb / 1024:.0f}")
    return peaks
