"""Redis URLs with credentials and TLS reach the router's adapters."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError

from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.runner import RouterRunner
from eco_router.entrypoints.settings import ConfigError, load_settings
from eco_router.testing import RedisServer
from tests.integration.polling import eventually


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with openssl."""
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "ca-key", "cert", "key")}
    run = [lambda *args: subprocess.run(args, check=True, capture_output=True)][0]
    run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=eco-router test CA",
        "-keyout",
        files["ca-key"],
        "-out",
        files["ca"],
    )
    csr = tmp_path / "server.csr"
    run(
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        files["key"],
        "-out",
        csr,
    )
    ext = tmp_path / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "openssl",
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        files["ca"],
        "-CAkey",
        files["ca-key"],
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        ext,
        "-out",
        files["cert"],
    )
    return files  # fmt: skip


@pytest.fixture
def secured_server(tls_files: dict[str, Path]) -> Iterator[tuple[RedisServer, int]]:
    """A server with a TLS port and an ACL user `router` (password `s3cret`)."""
    tls_port = free_port()
    args = [
        "--tls-port", str(tls_port),
        "--tls-cert-file", str(tls_files["cert"]),
        "--tls-key-file", str(tls_files["key"]),
        "--tls-ca-cert-file", str(tls_files["ca"]),
        "--tls-auth-clients", "no",
        "--user", "router", "on", ">s3cret", "~*", "&*", "+@all",
    ]  # fmt: skip
    with RedisServer(extra_args=args) as server:
        yield server, tls_port


async def route_one_event(streams_url: str, pubsub_url: str) -> dict[str, object]:
    settings = load_settings(
        REDIS_STREAMS_URL=streams_url,
        REDIS_PUBSUB_URL=pubsub_url,
        read_block_ms=100,
        consumer_name="url-test",
    )
    container = build_container(settings)
    async with RouterRunner(container):
        client = Redis.from_url(streams_url)
        try:
            await client.xadd("scan:events:0", {"job_id": "job-url", "seq": "3"})
            state = await eventually(lambda: client.get("scan:state:job-url"))
        finally:
            await client.aclose()
    decoded = orjson.loads(state)
    assert isinstance(decoded, dict)
    return decoded


class TestCredentialsAndTls:
    async def test_user_and_password_in_the_url_authenticate(
        self, secured_server: tuple[RedisServer, int]
    ) -> None:
        server, _ = secured_server
        url = f"redis://router:s3cret@127.0.0.1:{server.port}/0"
        assert (await route_one_event(url, url))["seq"] == 3

    async def test_a_wrong_password_stops_startup(
        self, secured_server: tuple[RedisServer, int]
    ) -> None:
        server, _ = secured_server
        url = f"redis://router:wrong@127.0.0.1:{server.port}/0"
        with pytest.raises(AuthenticationError):
            await route_one_event(url, url)

    async def test_rediss_urls_use_tls(
        self, secured_server: tuple[RedisServer, int], tls_files: dict[str, Path]
    ) -> None:
        _, tls_port = secured_server
        url = f"rediss://router:s3cret@127.0.0.1:{tls_port}/0?ssl_ca_certs={tls_files['ca']}"
        assert (await route_one_event(url, url))["seq"] == 3

    async def test_unix_socket_urls_reach_the_server(self, tmp_path: Path) -> None:
        path = tmp_path / "redis.sock"
        with RedisServer(extra_args=["--unixsocket", str(path)]):
            url = f"unix://{path}?db=0"
            assert (await route_one_event(url, url))["seq"] == 3

    def test_an_unknown_scheme_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="REDIS_PUBSUB_URL"):
            load_settings(REDIS_PUBSUB_URL="tcp://127.0.0.1:6379")
