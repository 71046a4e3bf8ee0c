"""Stopping `eco-router serve` with SIGINT while viewers are connected: real processes, real
sockets."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tests.integration.sse_client import open_sse, sse_client
from tests.integration.support import WorkerProcess

# The demo's chat answer streams for 6-12 s, well beyond what a stop may take.
STOPPED_WITHIN_S = 5.0


@asynccontextmanager
async def serving(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`eco-router serve ARGS --port 0` and its address once it accepts connections; killed on
    exit if the test has not stopped it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENT_ROUTER_")}
    process = await asyncio.create_subprocess_exec(
        *WorkerProcess.command(),
        *("serve", *args, "--port", "0"),
        env={**env, "EVENT_ROUTER_LOG_LEVEL": "INFO"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        address = None
        async with asyncio.timeout(30):
            line = ""
            while "Application startup complete" not in line:
                line = (await process.stderr.readline()).decode()
                assert line, "serve ended before it started"
                if match := re.search(r"open (http://[\d.]+:\d+)/", line):
                    address = match.group(1)
        assert address is not None
        yield process, address
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


class TestSigintWithInMemoryAdapters:
    async def test_open_streams_end_cleanly_and_demo_jobs_stop_at_once(self) -> None:
        async with serving("--in-memory", "--demo") as (process, base_url):
            async with sse_client(base_url) as client:
                chat = (await client.post("/api/v1/demo/jobs", params={"chat": "true"})).json()
                scan = (await client.post("/api/v1/demo/jobs")).json()
                async with (
                    open_sse(client, chat["events"]) as chat_stream,
                    open_sse(client, scan["events"]) as scan_stream,
                ):
                    assert (chat_stream.status_code, scan_stream.status_code) == (200, 200)
                    await chat_stream.read(1)
                    await scan_stream.read(1)

                    process.send_signal(signal.SIGINT)
                    asked = time.monotonic()
                    # A stream cut instead of ended fails here (incomplete chunked read).
                    chat_rest = await chat_stream.read_to_end(timeout_s=STOPPED_WITHIN_S)
                    scan_rest = await scan_stream.read_to_end(timeout_s=STOPPED_WITHIN_S)
            assert process.stderr is not None
            async with asyncio.timeout(STOPPED_WITHIN_S):
                stderr = (await process.stderr.read()).decode()
                await process.wait()
            took_s = time.monotonic() - asked

        assert process.returncode == 0, stderr
        assert took_s < STOPPED_WITHIN_S, stderr
        assert "Traceback" not in stderr
        assert "timeout graceful shutdown exceeded" not in stderr
        # The jobs were stopped, not run to their end: neither stream reached a terminal event.
        assert not any(event.terminal for event in chat_rest + scan_rest), (chat_rest, scan_rest)
