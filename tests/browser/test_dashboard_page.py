"""The dashboard page in a real browser: twenty demo jobs progress to their end over one
stream (`GET /api/v1/streams`, read by the TypeScript client), and a dropped connection resumes
every job without a duplicate.

`eco-router serve --in-memory --demo` runs as a subprocess at the tests' pace; Debian's
chromium is driven headless through Playwright.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.test_demo_page import (
    JOB_TIMEOUT_MS,
    RECORD_STREAMS,
    TEST_EVENTS_PER_S,
    _demo_server,
    browser,
    connections,
    received_frames,
)

# A fixture of the demo page's tests, used here too.
__all__ = ["browser"]

JOBS = 20


@pytest.fixture
def dashboard_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of each test's own: starting 20 demo jobs takes the whole process's burst."""
    yield from _demo_server(tmp_path_factory, EVENT_ROUTER_DEMO_EVENTS_PER_S=TEST_EVENTS_PER_S)


@pytest.fixture
def dashboard(browser: Browser, dashboard_server: str) -> Iterator[Page]:
    context = browser.new_context(base_url=dashboard_server)
    context.set_default_timeout(JOB_TIMEOUT_MS)
    context.add_init_script(RECORD_STREAMS)
    opened = context.new_page()
    opened.goto("/dashboard")
    try:
        yield opened
    finally:
        context.close()


def rows(page: Page) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = page.locator("#jobs tr").evaluate_all(
        """rows => rows.map(row => ({
             job: row.dataset.job,
             state: row.querySelector(".state").textContent,
             width: row.querySelector(".bar > div").style.width,
           }))"""
    )
    return found


def all_ended(page: Page) -> None:
    expect(page.locator("#summary")).to_have_text(f"{JOBS} of {JOBS} jobs ended")


def events_per_job(page: Page) -> Counter[tuple[str, int]]:
    """(job, seq) of every event frame the page's stream received."""
    seen: Counter[tuple[str, int]] = Counter()
    for frame in received_frames(page):
        body = json.loads(frame["data"])
        data = body["data"]
        if isinstance(data, dict) and "seq" in data:
            seen[(body["job_id"], data["seq"])] += 1
    return seen


class TestDashboard:
    def test_twenty_jobs_progress_to_their_end_over_one_stream(self, dashboard: Page) -> None:
        dashboard.get_by_role("button", name="Start 20 demo jobs").click()
        # Checked every frame while they run: several jobs move at once on the one stream.
        dashboard.wait_for_function(
            """() => [...document.querySelectorAll("#jobs .bar > div")]
                 .filter(bar => bar.style.width && bar.style.width !== "0%" &&
                                bar.style.width !== "100%").length >= 2""",
            polling="raf",
        )
        all_ended(dashboard)

        shown = rows(dashboard)
        assert len(shown) == JOBS
        # Demo jobs fail now and then: either end is an end, with the bar where it stopped.
        assert {row["state"] for row in shown} <= {"done", "failed"}
        assert all(row["width"] == "100%" for row in shown if row["state"] == "done")
        [stream] = connections(dashboard)
        assert "/api/v1/streams?" in stream["url"]
        assert stream["url"].count("job=") == JOBS
        seen = events_per_job(dashboard)
        assert len({job for job, _ in seen}) == JOBS
        assert max(seen.values()) == 1, "an event arrived twice"

    def test_a_dropped_connection_resumes_every_job_without_duplicates(
        self, dashboard: Page
    ) -> None:
        dashboard.get_by_role("button", name="Start 20 demo jobs").click()
        dashboard.wait_for_function(
            "document.querySelectorAll('#jobs tr.done, #jobs tr.failed').length < 20 && "
            "window.__frames.length >= 30",
            polling="raf",
        )
        dashboard.get_by_role("button", name="Drop the connection").click()
        all_ended(dashboard)

        opened = connections(dashboard)
        assert len(opened) == 2
        assert opened[1]["last_event_id"] is not None
        seen = events_per_job(dashboard)
        assert max(seen.values()) == 1, "an event arrived twice"
        assert all(row["state"] in {"done", "failed"} for row in rows(dashboard))
