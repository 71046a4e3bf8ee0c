"""The AI SDK from npm (`ai`, tests/ai_sdk) reads chat jobs from `eco-router serve`: its own
chat (what `useChat` runs) over `DefaultChatTransport` gets the job's exact text across a cut
connection and a resume, a reconnect gets the text so far in one delta, 204 once the job has
ended, and the chat's stop with eco-router's cancel stops the worker."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eco_router.application.demo_jobs import CHAT_ANSWERS
from tests.integration.sse_client import open_sse, sse_client
from tests.integration.test_gateway import Gateway, module_gateway

AI_SDK = Path(__file__).parents[1] / "ai_sdk"
NODE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """`eco-router serve --demo` on servers of its own: the demo's chat jobs are the workers."""
    with module_gateway(tmp_path_factory, "ai-sdk", demo=True) as started:
        yield started


class AppBackend(http.server.BaseHTTPRequestHandler):
    """An app's reconnect route, as docs/AI_SDK.md writes it for Next.js: a chat answering
    (here: every chat id but `idle`) is sent on to eco-router's stream with a 307, else 204."""

    gateway = ""

    def do_GET(self) -> None:
        parts = self.path.split("/")  # /api/chat/{id}/stream
        if parts[-1] != "stream" or parts[-2] == "idle":
            self.send_response(204)
            self.end_headers()
            return
        self.send_response(307)
        self.send_header("Location", f"{self.gateway}/api/v1/chat/{parts[-2]}/stream")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def app_backend(gateway: Gateway) -> Iterator[str]:
    handler = type("Backend", (AppBackend,), {"gateway": gateway.base_url})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def node(*args: str) -> Any:
    """Run tests/ai_sdk/chat.mjs; its one JSON line."""
    command = shutil.which("node")
    assert command is not None, "node is not installed: `make test` installs it"
    assert (AI_SDK / "node_modules" / "ai").is_dir(), (
        "the AI SDK is not installed: run `npm ci` in tests/ai_sdk (`make test` does)"
    )
    process = await asyncio.create_subprocess_exec(
        command,
        "chat.mjs",
        *args,
        cwd=AI_SDK,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(NODE_TIMEOUT_S):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def start_chat(gateway: Gateway, *, fail: bool = False) -> str:
    async with httpx.AsyncClient(base_url=gateway.base_url, trust_env=False) as client:
        response = await client.post(
            "/api/v1/demo/jobs", params={"chat": "true", "fail": str(fail).lower()}
        )
    assert response.status_code == 201, response.text
    job_id: str = response.json()["job_id"]
    return job_id


async def text_after_tokens(gateway: Gateway, job_id: str, tokens: int) -> str:
    """The job's text once `tokens` tokens were routed, read from its own SSE stream."""
    text = ""
    async with (
        sse_client(gateway.base_url) as client,
        open_sse(client, f"/api/v1/chat/{job_id}/events") as stream,
    ):
        seen = 0
        while seen < tokens:
            event = await stream.next_event(timeout_s=15)
            assert event is not None, stream.events
            assert event.event != "done", stream.events
            if event.event == "token":
                text += event.json()["content"]
                seen += 1
    return text


def check_of(text: str) -> dict[str, object]:
    data = text.encode()
    return {"bytes": len(data), "sha1": hashlib.sha1(data).hexdigest(), "truncated": False}


class TestResume:
    async def test_a_chat_cut_mid_answer_resumes_to_the_jobs_exact_text(
        self, gateway: Gateway
    ) -> None:
        job_id = await start_chat(gateway)
        result = await node("resume", gateway.base_url, job_id, "12")
        cut, answer = result["cut"], result["answer"]
        assert cut["status"] == "error"
        assert 0 < len(cut["answer"]["text"]) < len(answer["text"])
        assert result["status"] == "ready", result["error"]
        assert answer["id"] == job_id
        assert answer["text"] in CHAT_ANSWERS
        assert answer["text"].startswith(cut["answer"]["text"])
        assert answer["metadata"] == {
            "job_id": job_id,
            "status": "done",
            "text_check": check_of(answer["text"]),
        }
        assert result["seen"] == [
            {"method": "POST", "status": 200},
            {"method": "GET", "status": 200},
        ]

    async def test_a_reconnect_gets_the_text_so_far_in_one_delta_then_live_deltas(
        self, gateway: Gateway
    ) -> None:
        job_id = await start_chat(gateway)
        so_far = await text_after_tokens(gateway, job_id, 10)
        result = await node("reconnect", gateway.base_url, job_id)
        chunks = result["chunks"]
        assert chunks[:3] == [
            {"type": "start", "messageId": job_id},
            {"type": "start-step"},
            {"type": "text-start", "id": "text-1"},
        ]
        deltas = [c["delta"] for c in chunks if c["type"] == "text-delta"]
        assert deltas[0].startswith(so_far)
        text = "".join(deltas)
        assert text in CHAT_ANSWERS
        assert [c["type"] for c in chunks[-3:]] == ["text-end", "finish-step", "finish"]
        assert chunks[-1]["messageMetadata"]["text_check"] == check_of(text)

    async def test_a_reconnect_after_the_end_is_told_nothing_is_streaming(
        self, gateway: Gateway
    ) -> None:
        job_id = await start_chat(gateway)
        sent = await node("send", gateway.base_url, job_id)
        assert sent["status"] == "ready"
        assert await node("reconnect", gateway.base_url, job_id) == {"resumed": False}

    async def test_a_failed_job_is_the_chats_error(self, gateway: Gateway) -> None:
        job_id = await start_chat(gateway, fail=True)
        result = await node("send", gateway.base_url, job_id)
        assert result["status"] == "error"
        assert result["error"].startswith("answer failed")
        assert result["answer"]["id"] == job_id

    async def test_a_reconnect_through_the_apps_redirect_reads_the_job(
        self, gateway: Gateway, app_backend: str
    ) -> None:
        job_id = await start_chat(gateway)
        api = f"{app_backend}/api/chat"
        result = await node("reconnect", gateway.base_url, job_id, api)
        assert result["chunks"][0] == {"type": "start", "messageId": job_id}
        text = "".join(c["delta"] for c in result["chunks"] if c["type"] == "text-delta")
        assert text in CHAT_ANSWERS
        assert await node("reconnect", gateway.base_url, "idle", api) == {"resumed": False}


class TestStop:
    async def test_stop_with_the_cancel_stops_the_worker(self, gateway: Gateway) -> None:
        job_id = await start_chat(gateway)
        result = await node("stop", gateway.base_url, job_id, "20")
        assert result["status"] == "ready"
        assert result["cancel"]["status"] == 202
        assert result["cancel"]["body"]["kind"] == "cancel"
        stopped_at = result["answer"]["text"]
        # The job's own stream ends with the worker's answer to the cancel.
        async with (
            sse_client(gateway.base_url) as client,
            open_sse(client, f"/api/v1/chat/{job_id}/events") as stream,
        ):
            events = await stream.read(timeout_s=20)
        done = events[-1]
        assert done.event == "done"
        assert done.json()["status"] == "cancelled"
        final = ""
        for event in events:
            if event.event == "token_recovery":
                final = event.json()["accumulated"]
            elif event.event == "token":
                final += event.json()["content"]
        assert done.json()["text_check"] == check_of(final)
        assert final.startswith(stopped_at)
        assert final not in CHAT_ANSWERS
        # A send after the end reads the answer as it stopped, and why.
        sent = await node("send", gateway.base_url, job_id)
        assert sent["answer"]["text"] == final
        assert sent["answer"]["metadata"]["status"] == "cancelled"
