"""`serve --embedded-redis` and the operator commands of another terminal, as `make run` and a
newcomer's second shell use them: real processes, each test in a runtime directory of its
own, and an environment that names no Redis server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.support import WorkerProcess, eco_router, eventually

FAMILIES = "scan:events=2"
SECRET = "a-test-secret-of-at-least-32-bytes!"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A shell with no Redis URL and a runtime directory of its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVENT_ROUTER_", "REDIS_")) and k != "POD_NAME"
    }
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env.update(
        XDG_RUNTIME_DIR=str(runtime),
        EVENT_ROUTER_STREAMS=FAMILIES,
        EVENT_ROUTER_LOG_LEVEL="INFO",
        EVENT_ROUTER_CONSOLE="true",
    )
    return env


@dataclass
class Serve:
    process: asyncio.subprocess.Process
    base_url: str
    log: list[str]

    def redis_pid(self) -> int:
        [line] = [line for line in self.log if "embedded redis-server (pid" in line]
        found = re.search(r"\(pid (\d+)\) at (redis://\S+):", line)
        assert found is not None, line
        return int(found.group(1))

    def redis_url(self) -> str:
        [line] = [line for line in self.log if "embedded redis-server (pid" in line]
        found = re.search(r"at (redis://\S+):", line)
        assert found is not None, line
        return found.group(1)


@asynccontextmanager
async def serving(env: dict[str, str], *args: str) -> AsyncIterator[Serve]:
    """`eco-router serve ARGS --port 0` once it has started; killed at the end if the test
    has not stopped it."""
    process = await asyncio.create_subprocess_exec(
        *WorkerProcess.command(),
        *("serve", *args, "--port", "0"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    log: list[str] = []
    try:
        assert process.stderr is not None
        address = None
        async with asyncio.timeout(30):
            while not log or "Application startup complete" not in log[-1]:
                line = (await process.stderr.readline()).decode()
                assert line, "serve ended before it started:\n" + "".join(log)
                log.append(line)
                if match := re.search(r"open (http://[\d.]+:\d+)/", line):
                    address = match.group(1)
        assert address is not None
        yield Serve(process, address, log)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for good: its parent has not reaped it yet.
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(") ")[1].startswith("Z"))


def records(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["XDG_RUNTIME_DIR"]) / "eco-router").glob("serve-*.json"))


class TestEmbeddedRedis:
    async def test_the_cli_of_another_shell_finds_the_embedded_redis_and_names_it(
        self, env: dict[str, str]
    ) -> None:
        async with serving(env, "--demo", "--embedded-redis") as serve:
            url = serve.redis_url()
            [record] = records(env)
            assert json.loads(record.read_text()) == {
                "pid": serve.process.pid,
                "http_url": f"{serve.base_url}/",
                "streams_url": url,
                "pubsub_url": url,
                "redis_pid": serve.redis_pid(),
            }
            where = f"streams redis: {url} (embedded Redis of serve, pid {serve.process.pid})"

            published = await eco_router(
                env, "publish", "--job", "job-7", "--stage", "vision", "--status", "started"
            )
            status = await eco_router(env, "status")
            as_json = await eco_router(env, "status", "--json")

            async def routed() -> subprocess.CompletedProcess[str] | None:
                done = await eco_router(env, "state", "job-7")
                return done if done.returncode == 0 else None

            state = await eventually(routed, what="job-7 routed by serve's router")

        assert published.returncode == 0, published.stderr
        assert published.stdout.splitlines()[0] == where
        assert status.returncode == 0, status.stderr
        assert status.stdout.splitlines()[:2] == [
            where,
            "group eventrouter: 1 router alive, 2/2 shards held, lag 0, pending 0",
        ]
        assert json.loads(as_json.stdout)["streams_redis"] == {
            "url": url,
            "via": f"embedded Redis of serve, pid {serve.process.pid}",
        }
        assert state.stdout.splitlines()[:2] == [where, "scan job job-7: seq=10  vision/started"]

    @pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
    async def test_stopping_serve_stops_its_redis_and_removes_its_record(
        self, env: dict[str, str], sig: signal.Signals
    ) -> None:
        async with serving(env, "--demo", "--embedded-redis") as serve:
            redis_pid = serve.redis_pid()
            assert alive(redis_pid)
            serve.process.send_signal(sig)
            async with asyncio.timeout(20):
                code = await serve.process.wait()

        assert code == 0
        await eventually(lambda: not alive(redis_pid), what="the embedded redis-server gone")
        assert records(env) == []

    async def test_a_killed_serve_leaves_no_redis_and_its_record_is_ignored(
        self, env: dict[str, str]
    ) -> None:
        async with serving(env, "--embedded-redis") as serve:
            redis_pid = serve.redis_pid()
            serve.process.kill()
            await serve.process.wait()
            [stale] = records(env)

            await eventually(lambda: not alive(redis_pid), what="the embedded redis-server gone")
            # Another serve, in memory: the CLI must not take the dead one's Redis for it.
            async with serving(env, "--in-memory"):
                done = await eco_router(env, "status")

        assert done.returncode == 3
        assert "uses in-memory adapters" in done.stderr
        assert not stale.exists()

    async def test_the_cli_cannot_reach_an_in_memory_serve_and_says_how_to_get_one(
        self, env: dict[str, str]
    ) -> None:
        async with serving(env, "--in-memory") as serve:
            done = await eco_router(env, "status")
            serve.process.terminate()
            async with asyncio.timeout(20):
                assert await serve.process.wait() == 0

        assert done.returncode == 3
        assert done.stdout == ""
        assert done.stderr.splitlines() == [
            f"eco-router status: the running serve (pid {serve.process.pid}, "
            f"{serve.base_url}/) uses in-memory adapters, which no other process can reach; "
            "stop it and run `make run` or `eco-router serve --embedded-redis` (a private "
            "Redis the CLI finds by itself)"
        ]
        assert records(env) == []

    async def test_a_url_in_the_environment_wins_over_a_running_serve(
        self, env: dict[str, str]
    ) -> None:
        async with HttpPort() as port, serving(env, "--embedded-redis"):
            url = f"redis://127.0.0.1:{port.port}/0"
            done = await eco_router({**env, "REDIS_STREAMS_URL": url}, "status")

        assert done.returncode == 3
        assert f"the streams server at {url} is not a Redis server" in done.stderr


class HttpPort:
    """A port that answers as a web server does, to tell which server a command asked."""

    async def __aenter__(self) -> HttpPort:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        writer.close()


class TestToken:
    async def test_a_viewer_token_opens_its_job_and_no_other(self, env: dict[str, str]) -> None:
        env = {**env, "EVENT_ROUTER_JWT_SECRET": SECRET}
        async with serving(env, "--embedded-redis") as serve:
            minted = await eco_router(env, "token", "--job", "job-1", "--job", "job-2")
            token = minted.stdout.strip()
            async with httpx.AsyncClient(base_url=serve.base_url, trust_env=False) as client:
                mine = await _open_stream(client, "job-2", token)
                other = await _open_stream(client, "job-3", token)
                none = await _open_stream(client, "job-2", None)

        assert minted.returncode == 0, minted.stderr
        assert minted.stdout == token + "\n"
        assert mine == 200
        assert other == 403
        assert none == 401

    async def test_an_admin_token_opens_the_console_api_and_a_viewer_token_does_not(
        self, env: dict[str, str]
    ) -> None:
        env = {**env, "EVENT_ROUTER_JWT_SECRET": SECRET}
        async with serving(env, "--embedded-redis") as serve:
            admin = (await eco_router(env, "token", "--admin", "--ttl", "60")).stdout.strip()
            viewer = (await eco_router(env, "token", "--domain", "scan")).stdout.strip()
            async with httpx.AsyncClient(base_url=serve.base_url, trust_env=False) as client:
                as_admin = await client.get("/console/api/snapshot", headers=_bearer(admin))
                as_viewer = await client.get("/console/api/snapshot", headers=_bearer(viewer))

        assert as_admin.status_code == 200, as_admin.text
        assert as_viewer.status_code == 403

    async def test_an_expired_token_is_refused(self, env: dict[str, str]) -> None:
        env = {**env, "EVENT_ROUTER_JWT_SECRET": SECRET}
        async with serving(env, "--embedded-redis") as serve:
            viewer = (await eco_router(env, "token", "--job", "job-1", "--ttl", "1")).stdout
            admin = (await eco_router(env, "token", "--admin", "--ttl", "1")).stdout
            await asyncio.sleep(2.2)
            async with httpx.AsyncClient(base_url=serve.base_url, trust_env=False) as client:
                stream = await _open_stream(client, "job-1", viewer.strip())
                console = await client.get("/console/api/snapshot", headers=_bearer(admin.strip()))

        assert stream == 401
        assert console.status_code == 401

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("--job", "j1"), "no secret to sign with: set EVENT_ROUTER_JWT_SECRET"),
            (("--admin", "--job", "j1"), "--admin makes a console token"),
            ((), "give --job (repeatable), --domain, or --admin"),
            (("--domain", "billing"), "unknown domain 'billing'"),
        ],
        ids=["no-secret", "admin-with-job", "nothing", "unknown-domain"],
    )
    async def test_a_token_that_cannot_be_minted_is_one_line_and_exit_2(
        self, env: dict[str, str], args: tuple[str, ...], message: str
    ) -> None:
        secret = {} if args == ("--job", "j1") else {"EVENT_ROUTER_JWT_SECRET": SECRET}

        done = await eco_router({**env, **secret}, "token", *args)

        assert done.returncode == 2
        assert done.stdout == ""
        [line] = done.stderr.splitlines()
        assert line.startswith(f"eco-router token: {message}"), line


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def _open_stream(client: httpx.AsyncClient, job: str, token: str | None) -> int:
    """The status the SSE stream of `job` opens with (the stream itself is not read)."""
    headers = _bearer(token) if token else {}
    async with client.stream(
        "GET", f"/api/v1/scan/{job}/events", headers=headers, timeout=10
    ) as response:
        return response.status_code
