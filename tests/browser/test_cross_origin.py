"""A page on another origin opens `EventSource(gateway + "/api/v1/scan/{job}/events",
{ withCredentials: true })`, as a frontend served apart from its API does.

`eco-router serve --in-memory --demo` runs on one port with a JWT secret and
`EVENT_ROUTER_CORS_ORIGINS`; the page comes from a plain HTTP server on another port (another
origin of the same site, so the token cookie goes along, as from app.example.com to
api.example.com).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser

from tests.browser.test_demo_page import (
    COMPLETE_JOB,
    JOB_TIMEOUT_MS,
    _demo_server,
    browser,
)

__all__ = ["browser"]  # the shared chromium fixture, used by the tests below

SECRET = "cross-origin-test-secret-of-32-bytes!!"
COOKIE = "eco_router_token"
FRONTEND_PAGE = b"""<!doctype html>
<meta charset="utf-8"><title>frontend</title>
<script>
window.watch = (url) => new Promise((resolve) => {
  const seen = [];
  const source = new EventSource(url, { withCredentials: true });
  const finish = (how) => { source.close(); resolve({ seen, how }); };
  const names = ["snapshot", "queued", "vision", "rule", "answer", "reward", "done", "error"];
  for (const name of names) {
    source.addEventListener(name, (message) => {
      if (message.data === undefined) return;  // the browser's own error event, not a frame
      seen.push({ name, id: message.lastEventId });
      if (name === "done" || name === "error") finish("ended");
    });
  }
  source.onerror = () => { if (source.readyState === EventSource.CLOSED) finish("refused"); };
  setTimeout(() => finish("timed out"), 15000);
});
</script>
"""


class _Frontend(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(FRONTEND_PAGE)))
        self.end_headers()
        self.wfile.write(FRONTEND_PAGE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _frontend() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Frontend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def frontend() -> Iterator[str]:
    """The origin listed in the gateway's EVENT_ROUTER_CORS_ORIGINS."""
    yield from _frontend()


@pytest.fixture(scope="module")
def other_site() -> Iterator[str]:
    """An origin the gateway does not list."""
    yield from _frontend()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, frontend: str) -> Iterator[str]:
    yield from _demo_server(
        tmp_path_factory,
        EVENT_ROUTER_JWT_SECRET=SECRET,
        EVENT_ROUTER_CORS_ORIGINS=frontend,
        EVENT_ROUTER_DEMO_EVENTS_PER_S="5",
    )


@dataclass(frozen=True)
class DemoJob:
    events_url: str
    token: str


def start_job(gateway: str) -> DemoJob:
    """A demo job and the token cookie the gateway gives for it, as a login would."""
    response = httpx.post(f"{gateway}/api/v1/demo/jobs", timeout=5.0, trust_env=False)
    response.raise_for_status()
    return DemoJob(gateway + response.json()["events"], response.cookies[COOKIE])


def watch_from(browser: Browser, origin: str, gateway: str, job: DemoJob) -> dict[str, Any]:
    context = browser.new_context()
    context.set_default_timeout(JOB_TIMEOUT_MS)
    context.add_cookies([{"name": COOKIE, "value": job.token, "url": gateway}])
    try:
        page = context.new_page()
        page.goto(origin)
        watched: dict[str, Any] = page.evaluate("url => window.watch(url)", job.events_url)
        return watched
    finally:
        context.close()


def test_a_listed_origin_sees_every_stage_with_its_cookie(
    browser: Browser, gateway: str, frontend: str
) -> None:
    job = start_job(gateway)

    watched = watch_from(browser, frontend, gateway, job)

    # A browser faster than the router sees the job unknown first: a snapshot, without an id.
    events = [e for e in watched["seen"] if e["name"] != "snapshot"]
    assert watched["how"] == "ended"
    assert [int(e["id"]) for e in events] == COMPLETE_JOB
    assert [e["name"] for e in events][1:-1] == [
        stage for stage in ("vision", "rule", "answer", "reward") for _ in range(2)
    ]
    assert events[-1]["name"] == "done"
    assert all(e["name"] != "snapshot" for e in watched["seen"][1:])


def test_an_unlisted_origin_is_refused_by_the_browser(
    browser: Browser, gateway: str, other_site: str
) -> None:
    job = start_job(gateway)

    watched = watch_from(browser, other_site, gateway, job)

    assert watched == {"seen": [], "how": "refused"}
