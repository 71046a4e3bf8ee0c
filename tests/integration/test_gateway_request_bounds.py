"""An `eco-router serve` process bounds what one request may send (head, body, time) and how
many connections one address holds, with either parser: real sockets, real Redis, and the
process's own memory read from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eco_router.testing import RedisServer
from tests.integration.test_gateway import Gateway, Gateways
from tests.raw_http import PATIENCE_S, address_of, connected, until_closed

HEALTH = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
MIB = 1024 * 1024
# What an attacking connection tries to send; far more than the memory a test allows to grow.
ATTACK_BYTES = 16 * MIB
ATTACKERS = 8
RSS_GROWTH_ALLOWED = 32 * MIB


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from the test alone, never from the shell that runs it."""
    for name in list(os.environ):
        if name.startswith(("EVENT_ROUTER_", "REDIS_")) or name in {
            "POD_NAME",
            "FORWARDED_ALLOW_IPS",
        }:
            monkeypatch.delenv(name)


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    launcher = Gateways(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture(params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest) -> str:
    """EVENT_ROUTER_HTTP_PARSER: every bound holds with either parser."""
    value: str = request.param
    return value


@pytest.fixture
def gateway(
    gateways: Gateways, streams_server: RedisServer, pubsub_server: RedisServer, parser: str
) -> Gateway:
    """Every bound at its documented default; the console on, for its POST routes that read a
    body before any authorization."""
    return gateways.start(
        streams_url=streams_server.url,
        pubsub_url=pubsub_server.url,
        EVENT_ROUTER_HTTP_PARSER=parser,
        EVENT_ROUTER_CONSOLE="true",
    )


async def answer_and_close(base_url: str, request: bytes) -> bytes:
    """Everything the server sends to `request` (sent in one write) until it closes."""
    async with connected(address_of(base_url)) as (reader, writer):
        writer.write(request)
        await writer.drain()
        return await until_closed(reader)


def status_of(answer: bytes) -> int:
    found = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert found, f"not an HTTP answer: {answer[:200]!r}"
    return int(found.group(1))


def memory_kib(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak so far) of a process, in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB$", status, re.MULTILINE)
    assert found, status
    return int(found.group(1))


def post(path: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class TestRequestHeads:
    async def test_headers_past_the_limit_are_431_and_the_connection_closed(
        self, gateway: Gateway
    ) -> None:
        # 40 KiB of headers (the limit is 32 KiB), never finished.
        padding = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(40))
        request = b"GET /health HTTP/1.1\r\nHost: gateway\r\n" + padding

        answer = await answer_and_close(gateway.base_url, request)

        assert status_of(answer) == 431
        assert b"connection: close" in answer.lower()

    async def test_more_header_lines_than_the_limit_are_431(self, gateway: Gateway) -> None:
        lines = b"".join(b"X-N-%d: 1\r\n" % i for i in range(150))  # the limit is 100
        request = b"GET /health HTTP/1.1\r\nHost: gateway\r\n" + lines + b"\r\n"

        assert status_of(await answer_and_close(gateway.base_url, request)) == 431

    async def test_a_request_line_past_the_limit_is_414(self, gateway: Gateway) -> None:
        url = b"/health?pad=" + b"a" * 10_000  # the limit is 8 KiB
        request = b"GET " + url + b" HTTP/1.1\r\nHost: gateway\r\n\r\n"

        assert status_of(await answer_and_close(gateway.base_url, request)) == 414

    async def test_a_head_that_ends_inside_a_large_write_is_served(self, gateway: Gateway) -> None:
        # Not a regression test: the head is cut from the body where a limit falls inside the
        # write, so neither the body's bytes nor its lines count toward the head's limits.
        body = b'{"token": "t", "pad": "' + b"a" * 30_000 + b'"' + b"\n" * 5_000 + b"}"
        served = post(
            "/console/api/session", f"Content-Length: {len(body)}", "Connection: close", body=body
        )
        pipelined = HEALTH * 3 + b"GET /health HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n"

        answer = await answer_and_close(gateway.base_url, served)
        answers = await answer_and_close(gateway.base_url, pipelined)

        assert status_of(answer) == 204
        assert answers.count(b"HTTP/1.1 200 OK") == 4

    async def test_a_flood_of_endless_headers_keeps_memory_bounded_and_others_served(
        self, gateway: Gateway
    ) -> None:
        line = b"X-Pad: " + b"a" * 60_000 + b"\r\n"
        start = b"GET /health HTTP/1.1\r\nHost: gateway\r\n"

        sent, growth, statuses = await attack(gateway, start, line)

        assert all(s < ATTACK_BYTES for s in sent), sent  # each one was cut off
        assert growth < RSS_GROWTH_ALLOWED, f"RSS grew {growth // MIB} MiB"
        assert set(statuses) == {200}


class TestRequestBodies:
    async def test_a_body_declared_past_the_limit_is_413_at_once(self, gateway: Gateway) -> None:
        request = post("/console/api/session", "Content-Length: 100000", body=b'{"token": "')

        answer = await answer_and_close(gateway.base_url, request)

        assert status_of(answer) == 413
        assert b"connection: close" in answer.lower()

    async def test_a_chunked_body_past_the_limit_is_413(self, gateway: Gateway) -> None:
        chunk = b"%x\r\n%s\r\n" % (10_000, b"a" * 10_000)
        request = post("/console/api/session", "Transfer-Encoding: chunked", body=chunk * 7)

        assert status_of(await answer_and_close(gateway.base_url, request)) == 413

    async def test_an_unfinished_body_is_408_at_the_default_timeout(self, gateway: Gateway) -> None:
        for path in ("/console/api/session", "/console/api/dead-letters/replay"):
            request = post(path, "Content-Length: 1000", body=b'{"token": "')

            answer = await answer_and_close(gateway.base_url, request)

            assert status_of(answer) == 408
            assert b"connection: close" in answer.lower()

    async def test_a_body_trickled_under_the_idle_timeout_is_still_408(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        parser: str,
    ) -> None:
        # A short body timeout keeps the test short; it bounds the whole body, whatever pace.
        gateway = gateways.start(
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            EVENT_ROUTER_HTTP_PARSER=parser,
            EVENT_ROUTER_CONSOLE="true",
            EVENT_ROUTER_HTTP_BODY_TIMEOUT_S="1",
        )
        async with connected(address_of(gateway.base_url)) as (reader, writer):
            writer.write(post("/console/api/session", "Content-Length: 1000"))
            answer = asyncio.ensure_future(until_closed(reader))
            with contextlib.suppress(ConnectionError):
                while not answer.done():
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(0.2)

            assert status_of(await answer) == 408

    async def test_a_flood_of_endless_chunked_bodies_keeps_memory_bounded_and_others_served(
        self, gateway: Gateway
    ) -> None:
        start = post("/console/api/session", "Transfer-Encoding: chunked")
        chunk = b"%x\r\n%s\r\n" % (60_000, b"a" * 60_000)

        sent, growth, statuses = await attack(gateway, start, chunk)

        assert all(s < ATTACK_BYTES for s in sent), sent
        assert growth < RSS_GROWTH_ALLOWED, f"RSS grew {growth // MIB} MiB"
        assert set(statuses) == {200}


async def attack(gateway: Gateway, start: bytes, piece: bytes) -> tuple[list[int], int, list[int]]:
    """`ATTACKERS` connections each send `start`, then `piece` over and over until they have
    sent `ATTACK_BYTES` or the server closes them, while another client asks for /health.

    Returns the bytes each attacker sent, how much the process's peak RSS grew over its RSS
    before the attack, and the statuses /health answered meanwhile."""
    pid = gateway.process.pid
    before = memory_kib(pid, "VmRSS") * 1024
    stop = asyncio.Event()
    health = asyncio.ensure_future(health_until(gateway.base_url, stop))
    try:
        sent = await asyncio.gather(
            *(send_until_cut_off(gateway.base_url, start, piece) for _ in range(ATTACKERS))
        )
    finally:
        stop.set()
        statuses = await health
    peak = memory_kib(pid, "VmHWM") * 1024
    return list(sent), peak - before, statuses


async def send_until_cut_off(base_url: str, start: bytes, piece: bytes) -> int:
    sent = 0
    async with connected(address_of(base_url)) as (_, writer):
        try:
            writer.write(start)
            while sent < ATTACK_BYTES:
                writer.write(piece)
                await asyncio.wait_for(writer.drain(), PATIENCE_S)
                sent += len(piece)
        except ConnectionError:
            pass
    return sent


async def health_until(base_url: str, stop: asyncio.Event) -> list[int]:
    """/health's statuses, asked again and again (at least once) until `stop` is set."""
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=PATIENCE_S, trust_env=False) as http:
        while True:
            statuses.append((await http.get("/health")).status_code)
            if stop.is_set():
                return statuses
            await asyncio.sleep(0.05)


# A second loopback address: the kernel routes all of 127.0.0.0/8 to lo.
OTHER_ADDRESS = "127.0.0.2"
# The per-address cap's documented default.
PER_CLIENT = 64


class TestConnectionsPerAddress:
    async def test_past_the_cap_per_address_new_connections_are_closed_and_others_served(
        self,
        gateways: Gateways,
        streams_server: RedisServer,
        pubsub_server: RedisServer,
        parser: str,
    ) -> None:
        gateway = gateways.start(
            streams_url=streams_server.url,
            pubsub_url=pubsub_server.url,
            EVENT_ROUTER_HTTP_PARSER=parser,
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS="100",
            # Loopback is a trusted proxy by default (uvicorn's), whose connections the cap
            # leaves alone; here it is a client like any other.
            FORWARDED_ALLOW_IPS="192.0.2.1",
        )
        async with contextlib.AsyncExitStack() as stack:
            held = [
                await stack.enter_async_context(connected(address_of(gateway.base_url)))
                for _ in range(150)
            ]
            # Past the cap each one is closed unanswered; the ones within it are served.
            excess = await asyncio.gather(*(ask(held[i], HEALTH) for i in range(PER_CLIENT, 150)))
            within = await asyncio.gather(*(ask(held[i], HEALTH) for i in range(PER_CLIENT)))
            async with httpx.AsyncClient(
                base_url=gateway.base_url,
                transport=httpx.AsyncHTTPTransport(local_address=OTHER_ADDRESS),
                trust_env=False,
            ) as other:
                elsewhere = (await other.get("/health")).status_code

        assert set(excess) == {b""}
        assert {status_of(a) for a in within} == {200}
        assert elsewhere == 200


async def ask(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes
) -> bytes:
    """The first line the server answers `request` with, or b"" if it closed the connection."""
    reader, writer = connection
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), PATIENCE_S)
    except ConnectionError:
        return b""
