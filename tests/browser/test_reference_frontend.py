"""A browser listening as the reference design's frontend does: one `EventSource` on the
legacy route with a named listener per stage (queued, vision, rule, answer, reward, done),
while a worker publishes through `publish_stage_event` on its own client."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from playwright.sync_api import Browser, Page

from eco_router.producer import publish_stage_event
from eco_router.testing import RedisServer
from tests.browser.test_demo_page import JOB_TIMEOUT_MS, _demo_server, browser

__all__ = ["browser"]

RESULT = {"answer": "정상입니다", "category": "플라스틱"}
STAGES = ("vision", "rule", "answer", "reward")

LISTEN_AS_THE_REFERENCE_FRONTEND = """
(jobId) => new Promise((resolve, reject) => {
  window.__seen = [];
  const source = new EventSource(`/api/v1/stream?job_id=${encodeURIComponent(jobId)}`);
  for (const name of ["queued", "vision", "rule", "answer", "reward", "done"]) {
    source.addEventListener(name, (message) => {
      window.__seen.push({ name, id: message.lastEventId, data: JSON.parse(message.data) });
      if (name === "done") source.close();
    });
  }
  source.onopen = () => resolve(true);
  source.onerror = () => reject(new Error("the stream could not be opened"));
})
"""


@pytest.fixture(scope="module")
def streams() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory, streams: RedisServer) -> Iterator[str]:
    """`eco-router serve` (router inside) on the test's own redis-server."""
    yield from _demo_server(
        tmp_path_factory,
        in_memory=False,
        REDIS_STREAMS_URL=streams.url,
        EVENT_ROUTER_READ_BLOCK_MS="100",
    )


@pytest.fixture
def page(browser: Browser, gateway_url: str) -> Iterator[Page]:
    """A page of the gateway's own origin, so its EventSource is same-origin."""
    context = browser.new_context(base_url=gateway_url)
    context.set_default_timeout(JOB_TIMEOUT_MS)
    opened = context.new_page()
    opened.goto("/health")
    try:
        yield opened
    finally:
        context.close()


def run_pipeline(url: str, job_id: str) -> None:
    """The reference design's worker: each stage started and completed, then done."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        publish_stage_event(client, job_id, "queued", "started", progress=0)
        for number, stage in enumerate(STAGES):
            publish_stage_event(client, job_id, stage, "started", progress=number * 25)
            publish_stage_event(client, job_id, stage, "completed", progress=(number + 1) * 25)
        publish_stage_event(client, job_id, "done", "completed", result=RESULT)
    finally:
        client.close()


def test_every_named_listener_sees_its_stage_move(page: Page, streams: RedisServer) -> None:
    job = str(uuid.uuid4())
    assert page.evaluate(LISTEN_AS_THE_REFERENCE_FRONTEND, job) is True

    worker = threading.Thread(target=run_pipeline, args=(streams.url, job))
    worker.start()
    page.wait_for_function("window.__seen.some((event) => event.name === 'done')")
    worker.join(10)
    seen: list[dict[str, Any]] = page.evaluate("window.__seen")

    assert [(event["name"], event["id"]) for event in seen] == [
        ("queued", "0"),
        ("vision", "10"),
        ("vision", "11"),
        ("rule", "20"),
        ("rule", "21"),
        ("answer", "30"),
        ("answer", "31"),
        ("reward", "40"),
        ("reward", "41"),
        ("done", "51"),
    ]
    assert [event["data"]["status"] for event in seen[1:-1]] == ["started", "completed"] * 4
    assert [event["data"].get("progress") for event in seen] == [
        0, 0, 25, 25, 50, 50, 75, 75, 100, None
    ]  # fmt: skip
    assert seen[-1]["data"]["result"] == RESULT
