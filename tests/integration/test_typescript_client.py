"""The TypeScript client (clients/typescript) against a real `eco-router serve` on real Redis.

The test starts the servers and `serve --demo` with a JWT secret, builds the package, and runs
its tests with node's test runner (`node --test`), which reach the server through
ECO_ROUTER_URL: cuts at random points, many jobs, cancel and input retried under one key,
tokens and cookies. Node.js and the package's node_modules come from `make ts-deps`
(`npm ci`); nothing is downloaded here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eco_router.application.demo_jobs import CHAT_ANSWERS
from eco_router.testing import RedisServer
from tests.integration.support import WorkerProcess
from tests.integration.test_control_processes import default_env, free_port

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
# A test secret, long enough for the gateway's minimum.
JWT_SECRET = "typescript-client-tests-secret-0123456789abcdef"
READY_TIMEOUT_S = 20.0
NODE_TESTS_TIMEOUT_S = 300


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: `make nodejs` installs Node.js and npm", pytrace=False)
    return found


def _package_tool(name: str) -> Path:
    tool = PACKAGE / "node_modules" / ".bin" / name
    if not tool.exists():
        pytest.fail(
            f"{tool} not found: `make ts-deps` installs the package's dependencies (npm ci)",
            pytrace=False,
        )
    return tool


@pytest.fixture
def served(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> Iterator[tuple[str, dict[str, str]]]:
    """`eco-router serve --demo` with a JWT secret; yields its URL and its environment."""
    env = default_env(streams_server, pubsub_server) | {
        "EVENT_ROUTER_JWT_SECRET": JWT_SECRET,
        "EVENT_ROUTER_DEMO_EVENTS_PER_S": "10",
        # A burst of two messages per sender and job, then one a second: a third is a 429.
        "EVENT_ROUTER_CONTROL_BURST": "2",
        "EVENT_ROUTER_CONTROL_RATE_PER_S": "1",
    }
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *WorkerProcess.command(),
                "serve",
                "--demo",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert process.poll() is None, log.read_text(errors="replace")
            try:
                if httpx.get(f"{base_url}/ready", timeout=1.0, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve not ready\n" + log.read_text(
                errors="replace"
            )
            time.sleep(0.05)
        yield base_url, env
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_clients_node_tests_pass_against_a_real_server(
    served: tuple[str, dict[str, str]],
) -> None:
    base_url, server_env = served
    streams_url = server_env["REDIS_STREAMS_URL"]
    node = _tool("node")
    subprocess.run(
        [str(_package_tool("tsc")), "-p", "tsconfig.build.json"], cwd=PACKAGE, check=True
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "ECO_ROUTER_URL": base_url,
        "ECO_ROUTER_CLI": json.dumps(WorkerProcess.command()),
        "ECO_ROUTER_CHAT_ANSWERS": json.dumps(list(CHAT_ANSWERS)),
        # A chat job's worker the tests drive themselves (a retried attempt).
        "ECO_ROUTER_PRODUCER": json.dumps(
            [sys.executable, "-m", "tests.integration.typescript_producer", streams_url]
        ),
        "ECO_ROUTER_ROOT": str(ROOT),
        # `eco-router token` signs with the server's secret.
        "EVENT_ROUTER_JWT_SECRET": server_env["EVENT_ROUTER_JWT_SECRET"],
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    run = subprocess.run(
        [
            node,
            "--test",
            "--test-reporter=tap",
            *sorted(str(p) for p in PACKAGE.glob("test/*.test.mjs")),
        ],
        cwd=PACKAGE,
        env=env,
        capture_output=True,
        text=True,
        timeout=NODE_TESTS_TIMEOUT_S,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    counts = {k: int(v) for k, v in re.findall(r"^# (pass|fail|skipped|todo) (\d+)$", report, re.M)}
    assert counts.get("fail") == 0, report
    assert counts.get("skipped") == 0, report
    assert counts.get("pass", 0) >= 10, report


def test_the_committed_browser_bundle_is_what_the_sources_make() -> None:
    _package_tool("esbuild")
    run = subprocess.run(
        [_tool("node"), "scripts/bundle.mjs", "--check"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
