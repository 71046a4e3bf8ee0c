"""Cancel and input end to end on real processes and servers, on the documented defaults:
`eco-router serve` (and `worker`) processes, a job's worker on the producer SDK as a process,
viewers on SSE."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from eco_router.adapters.redis.keys import JobKeys
from eco_router.domain.streams import StreamFamily
from eco_router.producer import connect_async, producer_config
from eco_router.testing import RedisServer
from tests.integration.sse_client import SseStream, open_sse, sse_client
from tests.integration.support import WorkerProcess, eventually

ROOT = Path(__file__).resolve().parents[2]
CHAT = StreamFamily("chat:events", 4)
STATE_TTL_S = 3600  # EVENT_ROUTER_STATE_TTL_S's default


def default_env(streams: RedisServer, pubsub: RedisServer) -> dict[str, str]:
    """The servers, and nothing else of eco-router's settings: every default holds."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVENT_ROUTER_", "REDIS_")) and k != "POD_NAME"
    }
    return env | {"REDIS_STREAMS_URL": streams.url, "REDIS_PUBSUB_URL": pubsub.url}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """The test's child processes, killed at teardown."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, *command: str, env: dict[str, str] | None = None) -> Path:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                list(command),
                env=env or self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append(process)
        return log

    async def serve(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
        """`eco-router serve ARGS` on a free port, once /ready answers."""
        port = free_port()
        self.spawn(name, *WorkerProcess.command(), "serve", "--port", str(port), *args)
        process, base = self.started[-1], f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            assert process.poll() is None, (self.log_dir / f"{name}.log").read_text()
            try:
                async with httpx.AsyncClient(base_url=base, trust_env=False) as client:
                    return (await client.get("/ready")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, timeout_s=30, what=f"{name} ready")
        return process, base

    def router(self) -> None:
        """`eco-router worker` (the router), its probes on a free port."""
        env = self.env | {"EVENT_ROUTER_HTTP_PORT": "0"}
        self.spawn("router", *WorkerProcess.command(), "worker", env=env)

    def job_worker(self, name: str, url: str, job_id: str, mode: str) -> JobWorker:
        log = self.spawn(
            name, sys.executable, "-m", "tests.integration.control_job_worker", url, job_id, mode
        )
        return JobWorker(self.started[-1], log)

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait()


class JobWorker:
    """A job's worker process and the lines it printed."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    def lines(self) -> list[dict[str, Any]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def messages(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if "kind" in line]

    async def ready(self) -> JobWorker:
        await eventually(lambda: {"ready": True} in self.lines(), what="job worker ready")
        return self

    async def received(self, count: int) -> list[dict[str, Any]]:
        def enough() -> bool:
            assert self.process.poll() in (None, 0), self.log.read_text()
            return len(self.messages()) >= count

        await eventually(enough, timeout_s=20, what=f"{count} control messages")
        return self.messages()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def processes(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> Iterator[Processes]:
    launched = Processes(tmp_path, default_env(streams_server, pubsub_server))
    yield launched
    launched.kill_all()


@asynccontextmanager
async def viewer(base: str, job_id: str) -> AsyncIterator[SseStream]:
    async with sse_client(base) as client, open_sse(client, f"/api/v1/chat/{job_id}/events") as s:
        assert s.status_code == 200
        yield s


async def post(base: str, path: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as client:
        return await client.post(path, **kwargs)


async def queued(url: str, job_id: str) -> None:
    publisher = connect_async(url, producer_config(domain="chat", shards=4))
    await publisher.publish_stage_event(job_id, "queued", "queued")


class TestCancel:
    async def test_a_cancel_sent_while_the_worker_is_stopped_reaches_the_restarted_worker(
        self, processes: Processes, streams_server: RedisServer
    ) -> None:
        _, base = await processes.serve("serve")
        job = "job-cancel-1"
        await queued(streams_server.url, job)
        async with viewer(base, job) as stream:
            first = await processes.job_worker("first", streams_server.url, job, "hold").ready()
            answer = {"request_id": "in-1", "input": "blue"}
            sent = await post(base, f"/api/v1/chat/{job}/input", json=answer)
            assert sent.status_code == 202
            assert [m["kind"] for m in await first.received(1)] == ["input"]
            first.kill()

            cancels = [
                await post(base, f"/api/v1/chat/{job}/cancel", headers={"Idempotency-Key": "c-1"})
                for _ in range(2)
            ]
            assert [r.status_code for r in cancels] == [202, 202]
            assert cancels[0].json() == cancels[1].json()  # a duplicate POST, applied once
            second = await processes.job_worker("second", streams_server.url, job, "ack").ready()

            received = await second.received(2)
            events = await stream.read_to_end(timeout_s=20)

        assert [(m["kind"], m["body"], m["deliveries"]) for m in received] == [
            ("input", {"input": "blue"}, 2),
            ("cancel", {}, 1),
        ]
        assert received[1]["cancelled"]
        names = [e.event for e in events if e.event != "snapshot"]
        assert names == ["queued", "input_received", "cancel_requested", "done"]
        assert events[-1].json()["status"] == "cancelled"
        assert stream.ended
        await eventually(lambda: second.process.poll() == 0, what="the job worker's end")

        late = await post(base, f"/api/v1/chat/{job}/cancel", headers={"Idempotency-Key": "c-2"})
        assert (late.status_code, late.json()) == (409, {"detail": f"job {job} has already ended"})

        redis = Redis.from_url(streams_server.url)
        try:
            keys = JobKeys.in_family(CHAT, job)
            for key in (keys.control, keys.control_state):
                assert 0 < await redis.ttl(key) <= STATE_TTL_S
            # The duplicate cancel added nothing; both were acknowledged, so the log keeps no body.
            assert await redis.hget(keys.control_state, "count") == b"2"
            assert await redis.xlen(keys.control) == 0
        finally:
            await redis.aclose()


class TestGatewayKilledAfterItsAnswer:
    async def test_an_input_is_not_lost_when_the_gateway_dies_right_after_its_202(
        self, processes: Processes, streams_server: RedisServer
    ) -> None:
        processes.router()
        answering, base_a = await processes.serve("serve-a", "--no-router")
        _, base_b = await processes.serve("serve-b", "--no-router")
        job = "job-input-1"
        await queued(streams_server.url, job)
        worker = await processes.job_worker("job-worker", streams_server.url, job, "ack").ready()

        async with httpx.AsyncClient(base_url=base_a, trust_env=False, timeout=10) as client:
            sent = await client.post(
                f"/chat/{job}/input", json={"input": "yes"}, headers={"Idempotency-Key": "i-1"}
            )
            answering.send_signal(signal.SIGKILL)
        answering.wait()

        assert sent.status_code == 202
        assert [(m["kind"], m["body"]) for m in await worker.received(1)] == [
            ("input", {"input": "yes"})
        ]
        async with viewer(base_b, job) as stream:
            events = await stream.read(2, timeout_s=20)
        assert [e.event for e in events if e.event != "snapshot"][:2] == [
            "queued",
            "input_received",
        ]
        assert events[-1].json()["result"] == {"input": "yes"}


class TestTheReferenceQuestion:
    async def test_a_question_the_reply_and_the_rest_of_the_job_all_reach_the_viewer(
        self, processes: Processes, streams_server: RedisServer
    ) -> None:
        """The reference chat worker's entries, written as it writes them: `needs_input` is
        seq 190, above its `answer completed` (161) and `done` (181) that follow the reply."""
        _, base = await processes.serve("serve")
        job = "job-question-1"
        stream = CHAT.stream_for(job)
        redis = Redis.from_url(streams_server.url)

        async def write(seq: int, stage: str, status: str, **extra: str) -> None:
            fields = {"job_id": job, "stage": stage, "status": status, "seq": str(seq)}
            await redis.xadd(stream, fields | extra)

        try:
            async with viewer(base, job) as viewing:
                await write(0, "queued", "queued")
                await write(160, "answer", "started")
                await write(190, "needs_input", "waiting", message="Which colour?",
                            result='{"input_type": "text", "timeout": 300}')  # fmt: skip
                worker = processes.job_worker("worker", streams_server.url, job, "ack")
                await worker.ready()
                sent = await post(base, f"/chat/{job}/input", json={"input": "blue"})
                assert sent.status_code == 202
                assert [m["body"] for m in await worker.received(1)] == [{"input": "blue"}]
                await write(161, "answer", "completed")
                await write(181, "done", "done", result='{"colour": "blue"}')
                events = await viewing.read_to_end(timeout_s=20)
        finally:
            await redis.aclose()

        assert [(e.event, e.json().get("status")) for e in events if e.event != "snapshot"] == [
            ("queued", "queued"),
            ("answer", "started"),
            ("needs_input", "waiting"),
            ("input_received", "received"),
            ("answer", "completed"),
            ("done", "done"),
        ]
        ids = [e.seq for e in events if e.id is not None]
        assert ids == sorted(ids)
        assert viewing.ended
