"""A page built with the AI SDK (`ai` from npm, loaded by an import map: tests/ai_sdk/chat.html)
runs its chat in Chromium against `eco-router serve --in-memory --demo` on another origin: the
answer resumes whole after a cut connection, and stop with the cancel stops the job.

The page and the installed packages come from a plain HTTP server on another port, listed in
`EVENT_ROUTER_CORS_ORIGINS`; the chat's code is tests/ai_sdk/chat_core.mjs, the same the node
tests run.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from playwright.sync_api import Browser, Page

from eco_router.application.demo_jobs import CHAT_ANSWERS
from tests.browser.test_demo_page import JOB_TIMEOUT_MS, _demo_server, browser

__all__ = ["browser"]  # the shared chromium fixture, used by the tests below

AI_SDK = Path(__file__).parents[1] / "ai_sdk"


class _Files(http.server.SimpleHTTPRequestHandler):
    # Module scripts need a JavaScript type, whatever the machine's mimetypes say.
    extensions_map: ClassVar[dict[str, str]] = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
    }

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def frontend() -> Iterator[str]:
    """tests/ai_sdk served as it is: the page, its module and the installed packages."""
    assert (AI_SDK / "node_modules" / "ai").is_dir(), (
        "the AI SDK is not installed: run `npm ci` in tests/ai_sdk (`make test` does)"
    )
    handler = functools.partial(_Files, directory=str(AI_SDK))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, frontend: str) -> Iterator[str]:
    yield from _demo_server(tmp_path_factory, EVENT_ROUTER_CORS_ORIGINS=frontend)


@pytest.fixture
def page(browser: Browser, frontend: str) -> Iterator[Page]:
    context = browser.new_context()
    context.set_default_timeout(JOB_TIMEOUT_MS)
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{frontend}/chat.html")
        page.wait_for_function("document.title === 'ready'")
        yield page
        assert errors == []
    finally:
        context.close()


def start_chat(gateway: str) -> str:
    response = httpx.post(
        f"{gateway}/api/v1/demo/jobs", params={"chat": "true"}, timeout=5.0, trust_env=False
    )
    response.raise_for_status()
    job_id: str = response.json()["job_id"]
    return job_id


def test_the_pages_chat_resumes_a_cut_answer_whole(page: Page, gateway: str) -> None:
    job_id = start_chat(gateway)

    result = page.evaluate(
        "([base, job]) => window.aiChat.resume(base, job, 12)", [gateway, job_id]
    )

    text = result["answer"]["text"]
    assert result["cut"]["status"] == "error"
    assert 0 < len(result["cut"]["answer"]["text"]) < len(text)
    assert result["status"] == "ready"
    assert text in CHAT_ANSWERS
    check = result["answer"]["metadata"]["text_check"]
    assert check["sha1"] == hashlib.sha1(text.encode()).hexdigest()


def test_the_pages_stop_cancels_the_job(page: Page, gateway: str) -> None:
    job_id = start_chat(gateway)

    stopped = page.evaluate("([base, job]) => window.aiChat.stop(base, job, 20)", [gateway, job_id])
    assert stopped["cancel"]["status"] == 202

    sent = page.evaluate("([base, job]) => window.aiChat.send(base, job)", [gateway, job_id])
    assert sent["answer"]["metadata"]["status"] == "cancelled"
    assert sent["answer"]["text"].startswith(stopped["answer"]["text"])
    assert sent["answer"]["text"] not in CHAT_ANSWERS
