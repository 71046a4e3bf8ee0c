"""The operator console in a real browser: shards and routers live, dead letters appear as
they happen and are replayed, a job is looked up.

`eco-router serve` with the console on runs as a subprocess on a redis-server the fixture
starts; the test writes entries to it directly, as a producer (or a broken one) would.
Debian's chromium is driven headless through Playwright, as in test_demo_page.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Locator, Page, ViewportSize, expect
from redis import Redis

from eco_router.domain.streams import StreamFamily
from eco_router.producer import connect, producer_config
from eco_router.testing import RedisServer
from tests.browser.test_demo_page import (
    JOB_TIMEOUT_MS,
    _free_port,
    _serve_command,
    _wait_for_health,
    browser,
    stop_server,
)

__all__ = ["browser"]  # the shared chromium fixture, used by the tests below

SCAN = StreamFamily("scan:events", 4)
ROUTER = "browser-router"
SECRET = "browser-console-secret-" + "s" * 41
PHONE: ViewportSize = {"width": 390, "height": 844}
DANGER_RED = "rgb(185, 28, 28)"


@dataclass(frozen=True)
class ConsoleServer:
    base_url: str
    redis: Redis
    redis_url: str = ""


@contextmanager
def serving_console(log: Path, **env: str) -> Iterator[ConsoleServer]:
    """`eco-router serve` with the console on, routing a redis-server of its own."""
    port = _free_port()
    with RedisServer() as server:
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ROUTER_", "REDIS_"))
        }
        environment |= {
            "REDIS_STREAMS_URL": server.url,
            "EVENT_ROUTER_CONSOLE": "true",
            "EVENT_ROUTER_CONSOLE_REFRESH_S": "0.5",
            "EVENT_ROUTER_CONSUMER_NAME": ROUTER,
            "EVENT_ROUTER_READ_BLOCK_MS": "100",
            **env,
        }
        command = [*_serve_command(), "serve", "--host", "127.0.0.1", "--port", str(port)]
        with log.open("wb") as output:
            process = subprocess.Popen(
                command,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        base_url = f"http://127.0.0.1:{port}"
        redis = Redis.from_url(server.url)
        try:
            _wait_for_health(process, base_url, log)
            yield ConsoleServer(base_url, redis, server.url)
        finally:
            redis.close()
            stop_server(process)


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    """Open to everyone (no JWT secret), as `make run` serves it."""
    with serving_console(tmp_path_factory.mktemp("console") / "serve.log") as server:
        yield server


@pytest.fixture(scope="module")
def secured_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    """With a JWT secret: the console needs an admin token."""
    log = tmp_path_factory.mktemp("secured-console") / "serve.log"
    with serving_console(log, EVENT_ROUTER_JWT_SECRET=SECRET) as server:
        yield server


@pytest.fixture
def page(browser: Browser, console_server: ConsoleServer) -> Iterator[Page]:
    """The console, freshly loaded in its own browser context."""
    context = browser.new_context(base_url=console_server.base_url)
    context.set_default_timeout(JOB_TIMEOUT_MS)
    opened = context.new_page()
    opened.goto("/console")
    try:
        yield opened
    finally:
        context.close()


@pytest.fixture
def fresh_console(tmp_path: Path) -> Iterator[ConsoleServer]:
    """A console of its own: no dead letter yet, no event but the test's."""
    with serving_console(tmp_path / "serve.log") as server:
        yield server


@pytest.fixture
def fresh_page(browser: Browser, fresh_console: ConsoleServer) -> Iterator[Page]:
    context = browser.new_context(base_url=fresh_console.base_url)
    context.set_default_timeout(JOB_TIMEOUT_MS)
    opened = context.new_page()
    opened.goto("/console")
    try:
        yield opened
    finally:
        context.close()


def job_on(shard: int, stem: str) -> str:
    """A job id of `stem` that lands on `shard` of the scan family."""
    n = 0
    while SCAN.stream_for(f"{stem}-{n}") != SCAN.streams[shard]:
        n += 1
    return f"{stem}-{n}"


def dead_letter_rows(page: Page, job: str) -> list[str]:
    """The dead-letter ids of the rows listing `job`, top to bottom."""
    ids: list[str] = page.locator("#dl-table tbody tr", has_text=job).evaluate_all(
        "rows => rows.map(row => row.dataset.dlqId)"
    )
    return ids


class TestThePipeline:
    def test_every_shard_appears_with_the_router_holding_it(self, page: Page) -> None:
        for stream in SCAN.streams:
            holder = page.locator(f'tr[data-stream="{stream}"] .holder')
            expect(holder).to_have_text(ROUTER)
        expect(page.locator(".domain[data-domain='scan'] table.shards tbody tr")).to_have_count(4)
        router = page.locator(f'#routers tr[data-router="{ROUTER}"]')
        expect(router).to_contain_text("scan:events:0")
        # The default families: scan and chat, 4 shards each.
        expect(page.locator("#t-held")).to_have_text("8 / 8")
        expect(page.locator("#live")).to_have_attribute("data-state", "live")


class TestDeadLetters:
    def test_a_dead_letter_appears_live_and_replay_hands_it_back_to_the_router(
        self, page: Page, console_server: ConsoleServer
    ) -> None:
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
        job = job_on(1, "browser-broken")

        console_server.redis.xadd(SCAN.streams[1], {"job_id": job, "seq": "x"})

        row = page.locator("#dl-table tbody tr", has_text=job)
        expect(row).to_have_count(1)
        expect(row.locator(".reason")).to_have_text("seq_not_integer")
        (first,) = dead_letter_rows(page, job)

        row.get_by_role("button", name="Replay").click()

        expect(page.locator("#dl-notice")).to_contain_text(f"Replayed {first}")
        expect(page.locator(f'#dl-table tr[data-dlq-id="{first}"]')).to_have_count(0)
        # Replayed byte for byte, it is still invalid: the router judges it again and the new
        # letter appears live under a new id.
        expect(row).to_have_count(1)
        assert dead_letter_rows(page, job) != [first]

    def test_the_filter_and_replay_all_matching_then_the_job_shows_its_history(
        self, page: Page, console_server: ConsoleServer
    ) -> None:
        job = job_on(2, "browser-fixed")
        other = job_on(2, "browser-other")
        for name in (job, other):
            console_server.redis.xadd(SCAN.dead_letter_stream, _letter_of(name, SCAN.streams[2]))
        expect(page.locator("#dl-table tbody tr", has_text=other)).to_have_count(1)

        page.get_by_label("filter dead letters").fill(job)

        expect(page.locator("#dl-table tbody tr", has_text=other)).to_have_count(0)
        expect(page.locator("#dl-table tbody tr")).to_have_count(1)
        replay_all = page.get_by_role("button", name="Replay all matching")
        replay_all.click()
        page.get_by_role("button", name="Click again to replay").click()
        expect(page.locator("#dl-notice")).to_contain_text("Replayed")
        expect(page.locator("#dl-empty")).to_be_visible()

        page.get_by_label("job id").fill(job)
        page.get_by_role("button", name="Look up").click()

        expect(page.locator("#job-status")).to_have_text("completed")
        expect(page.locator("#job-history tbody tr")).to_have_count(1)
        expect(page.locator("#job-history tbody tr").first).to_have_attribute("data-seq", "7")
        expect(page.locator("#job-history tbody tr").first).to_contain_text("vision")
        # Nobody watches its stream: no gateway has a viewer of it.
        expect(page.locator("#job-viewers")).to_have_text("0")
        # The other job's letter was not replayed.
        page.get_by_label("filter dead letters").fill("")
        expect(page.locator("#dl-table tbody tr", has_text=other)).to_have_count(1)

    def test_replay_all_matching_replays_the_number_it_confirms_and_says_what_of_n_means(
        self, page: Page, console_server: ConsoleServer
    ) -> None:
        # More matching letters than the page lists (100), beside some that do not match.
        with console_server.redis.pipeline(transaction=False) as pipe:
            for n in range(150):
                pipe.xadd(SCAN.dead_letter_stream, _letter_of(f"browser-bulk-{n}", SCAN.streams[0]))
            for n in range(11):
                pipe.xadd(
                    SCAN.dead_letter_stream, _letter_of(f"browser-spare-{n}", SCAN.streams[0])
                )
            pipe.execute()
        expect(page.locator("#live")).to_have_attribute("data-state", "live")

        page.get_by_label("filter dead letters").fill("browser-bulk-")

        expect(page.locator("#dl-table tbody tr")).to_have_count(100)
        expect(page.locator("#dl-count")).to_contain_text("100 shown of 150 matching · ")
        page.get_by_role("button", name="Replay all matching").click()
        confirm = page.get_by_role("button", name="Click again to replay 150 matching")
        expect(confirm).to_be_visible()
        confirm.click()

        expect(page.locator("#dl-notice")).to_have_text("Replayed 150 dead letters")
        expect(page.locator("#dl-empty")).to_be_visible()
        left = [
            fields.get(b"field:job_id", b"").decode()
            for _, fields in console_server.redis.xrange(SCAN.dead_letter_stream)
        ]
        assert not [job for job in left if job.startswith("browser-bulk-")]
        assert sum(job.startswith("browser-spare-") for job in left) == 11

    def test_replay_all_is_disabled_and_neutral_while_there_is_nothing_to_replay(
        self, fresh_page: Page, fresh_console: ConsoleServer
    ) -> None:
        page = fresh_page
        replay_all = page.get_by_role("button", name="Replay all matching")
        expect(page.locator("#dl-empty")).to_be_visible()
        expect(page.locator("#dl-count")).to_contain_text("0 in all")

        expect(replay_all).to_be_disabled()
        assert _background(replay_all) != DANGER_RED

        job = job_on(0, "browser-first-letter")
        fresh_console.redis.xadd(SCAN.streams[0], {"job_id": job, "seq": "x"})
        expect(page.locator("#dl-table tbody tr", has_text=job)).to_have_count(1)
        expect(replay_all).to_be_enabled()
        # A filter matching nothing leaves nothing to replay again.
        page.get_by_label("filter dead letters").fill("matches-no-letter")
        expect(page.locator("#dl-empty")).to_be_visible()
        expect(replay_all).to_be_disabled()
        assert _background(replay_all) != DANGER_RED

    def test_stored_strings_are_shown_as_text_never_as_markup(
        self, page: Page, console_server: ConsoleServer
    ) -> None:
        job = job_on(3, "browser-markup")
        markup = '<img src=x onerror="window.__pwned=1"><b>bold</b>'

        console_server.redis.xadd(SCAN.streams[3], {"job_id": job, "seq": "1", "result": markup})

        row = page.locator("#dl-table tbody tr", has_text=job)
        expect(row).to_have_count(1)
        expect(row.locator(".reason")).to_have_text("result_not_json")
        row.locator("summary").click()
        expect(row.locator("pre.fields")).to_contain_text(markup)
        assert row.locator("img, b").count() == 0
        assert page.evaluate("window.__pwned") is None

    def test_control_and_format_characters_are_shown_escaped_as_the_cli_does(
        self, page: Page, console_server: ConsoleServer
    ) -> None:
        job = "browser-ctl\x1b[2J\u202e\u200b"
        expect(page.locator("#live")).to_have_attribute("data-state", "live")

        console_server.redis.xadd(SCAN.streams[0], {"job_id": job, "seq": "1", "note": "a\rb"})

        row = page.locator("#dl-table tbody tr", has_text="browser-ctl")
        expect(row).to_have_count(1)
        expect(row.locator("td.job")).to_have_text("browser-ctl\\u001b[2J\\u202e\\u200b")
        row.locator("summary").click()
        expect(row.locator("pre.fields")).to_contain_text("note=a\\u000db")
        shown = row.evaluate("row => row.textContent")
        # The only line breaks are those between fields, which the page puts there.
        assert not [c for c in shown if not c.isprintable() and c not in " \n"], repr(shown)


class TestJobLookup:
    def test_an_unknown_job_says_so(self, page: Page) -> None:
        expect(page.locator("#live")).to_have_attribute("data-state", "live")

        page.get_by_label("job id").fill("nobody-here")
        page.get_by_role("button", name="Look up").click()

        expect(page.locator("#job-notice")).to_contain_text("unknown or expired")
        expect(page.locator("#job-result")).to_be_hidden()

    def test_a_failed_job_shows_the_last_progress_it_reported(
        self, page: Page, console_server: ConsoleServer
    ) -> None:
        job = job_on(0, "browser-failed")
        stream = SCAN.streams[0]
        event = {"job_id": job, "stage": "answer"}
        console_server.redis.xadd(
            stream, {**event, "seq": "30", "status": "started", "progress": "46"}
        )
        console_server.redis.xadd(stream, {**event, "seq": "32", "status": "failed"})
        _wait_until_routed(console_server, job, events=2)

        page.get_by_label("job id").fill(job)
        page.get_by_role("button", name="Look up").click()
        expect(page.locator("#job-history tbody tr")).to_have_count(2)

        expect(page.locator("#job-status")).to_have_text("failed")
        expect(page.locator("#job-state")).to_contain_text("progress 46%")


class TestSigningIn:
    def test_a_viewer_token_is_turned_away_and_an_admin_token_opens_the_console(
        self, browser: Browser, secured_console: ConsoleServer
    ) -> None:
        context = browser.new_context(base_url=secured_console.base_url)
        context.set_default_timeout(JOB_TIMEOUT_MS)
        try:
            page = context.new_page()
            page.goto("/console")
            expect(page.locator("#signin")).to_be_visible()
            expect(page.locator("#console")).to_be_hidden()
            # No group is named before a snapshot says which.
            expect(page.locator("header .group")).to_be_hidden()

            page.get_by_label("admin token").fill(_token(jobs=["*"]))
            page.get_by_role("button", name="Sign in").click()
            expect(page.locator("#signin-error")).to_contain_text("not an admin token")

            page.get_by_label("admin token").fill(_token(admin=True))
            page.get_by_role("button", name="Sign in").click()

            expect(page.locator("#console")).to_be_visible()
            expect(page.locator(f'tr[data-stream="{SCAN.streams[0]}"] .holder')).to_have_text(
                ROUTER
            )
            expect(page.locator("header .group")).to_have_text("group eventrouter")
            # The live stream (an EventSource, which sends the cookie and no header) is let in.
            expect(page.locator("#live")).to_have_attribute("data-state", "live")
            (cookie,) = [c for c in context.cookies() if c["name"] == "eco_router_token"]
            assert cookie["httpOnly"] is True
        finally:
            context.close()


class TestFirstVisit:
    def test_the_sign_in_card_is_neutral_and_the_browser_logs_no_error(
        self, browser: Browser, secured_console: ConsoleServer
    ) -> None:
        context = browser.new_context(base_url=secured_console.base_url)
        context.set_default_timeout(JOB_TIMEOUT_MS)
        try:
            page = context.new_page()
            errors = _errors_logged(page)
            page.goto("/console")
            expect(page.locator("#signin")).to_be_visible()
            page.wait_for_load_state("networkidle")

            expect(page.locator("#signin-error")).to_be_hidden()
            assert page.locator("#signin-error").text_content() == ""
            assert errors == []
        finally:
            context.close()

    def test_a_refusal_shows_its_code_as_code_not_as_backticks(
        self, browser: Browser, secured_console: ConsoleServer
    ) -> None:
        context = browser.new_context(base_url=secured_console.base_url)
        context.set_default_timeout(JOB_TIMEOUT_MS)
        try:
            page = context.new_page()
            page.goto("/console")
            page.get_by_label("admin token").fill(_token(jobs=["*"]))
            page.get_by_role("button", name="Sign in").click()

            refusal = page.locator("#signin-error")
            expect(refusal).to_contain_text("not an admin token")
            expect(refusal).not_to_contain_text("`")
            expect(refusal.locator("code")).to_have_text('"admin": true')
            assert _colour(refusal) == DANGER_RED
        finally:
            context.close()


class TestLinks:
    def test_the_console_links_to_the_demo_and_the_dashboard(self, page: Page) -> None:
        pages = page.get_by_role("navigation", name="eco-router pages")
        expect(pages.get_by_role("link", name="Dashboard")).to_have_attribute("href", "/dashboard")
        expect(pages.get_by_role("link", name="Console")).to_have_attribute("aria-current", "page")

        pages.get_by_role("link", name="Demo").click()

        expect(page.get_by_role("heading", level=1)).to_have_text("eco-router")


class TestOnAPhone:
    def test_the_console_fits_the_width_with_every_view_filled(
        self, browser: Browser, console_server: ConsoleServer
    ) -> None:
        job = job_on(1, "browser-phone-" + "long-job-id-" * 4)
        event = {"job_id": job, "stage": "vision", "status": "started", "progress": "10"}
        console_server.redis.xadd(SCAN.streams[1], {**event, "seq": "1"})
        console_server.redis.xadd(SCAN.streams[1], {**event, "seq": "x"})
        context = browser.new_context(base_url=console_server.base_url, viewport=PHONE)
        context.set_default_timeout(JOB_TIMEOUT_MS)
        try:
            page = context.new_page()
            page.goto("/console")
            expect(page.locator("#live")).to_have_attribute("data-state", "live")
            row = page.locator("#dl-table tbody tr", has_text="browser-phone-")
            expect(row).to_have_count(1)
            row.locator("summary").click()
            page.get_by_label("job id").fill(job)
            page.get_by_role("button", name="Look up").click()
            expect(page.locator("#job-history tbody tr")).not_to_have_count(0)
            page.screenshot(path="/tmp/console-phone.png", full_page=True)

            assert _fits_the_width(page), _widest(page)
            _assert_the_header_fits(page)
            # Stacked, a cell still says what it is.
            expect(row.locator("td.job")).to_be_visible()
            assert (
                row.locator("td.job").evaluate("td => getComputedStyle(td, '::before').content")
                == '"Job"'
            )
        finally:
            context.close()

    def test_the_sign_in_card_fits_the_width(
        self, browser: Browser, secured_console: ConsoleServer
    ) -> None:
        context = browser.new_context(base_url=secured_console.base_url, viewport=PHONE)
        context.set_default_timeout(JOB_TIMEOUT_MS)
        try:
            page = context.new_page()
            page.goto("/console")
            expect(page.locator("#signin")).to_be_visible()
            page.get_by_label("admin token").fill(_token(jobs=["*"]))
            page.get_by_role("button", name="Sign in").click()
            expect(page.locator("#signin-error")).to_contain_text("not an admin token")
            page.screenshot(path="/tmp/console-phone-signin.png", full_page=True)

            assert _fits_the_width(page), _widest(page)
            _assert_the_header_fits(page)
        finally:
            context.close()


class TestTheRatesChart:
    def test_each_domain_charts_its_rates_and_lag_as_snapshots_arrive(
        self, fresh_page: Page, fresh_console: ConsoleServer
    ) -> None:
        page = fresh_page
        chart = page.locator(".domain[data-domain='scan'] svg.trend")
        expect(page.locator(".domain[data-domain='chat'] svg.trend")).to_have_count(1)
        expect(chart).to_have_attribute("role", "img")

        with _publishing(fresh_console.redis):
            # A rate needs two snapshots; then the in-rate line rises above its zero line.
            page.wait_for_function(RISEN, arg="scan")
            expect(chart).to_have_attribute("aria-label", re.compile(r"in [0-9.,]*[1-9][0-9.,]*/s"))
            page.screenshot(path="/tmp/console-chart.png", full_page=True)

        # The label tells the latest values, those the page shows beside it.
        label, tiles = page.evaluate(
            """() => [
                document.querySelector(".domain[data-domain='scan'] svg.trend")
                    .getAttribute("aria-label"),
                ["t-in", "t-out", "t-lag"].map(id => document.getElementById(id).textContent),
            ]"""
        )
        assert f"in {tiles[0]}/s" in label
        assert f"out {tiles[1]}/s" in label
        assert f"lag {tiles[2]} " in label
        assert chart.locator("title").text_content() == label
        # It keeps up with the polling: more points a moment later.
        points = _points(page, "scan", "in")
        page.wait_for_function(
            "([domain, n]) => " + POINTS + "(domain, 'in').length > n", arg=["scan", len(points)]
        )


# The points of a chart's line, in the SVG's own coordinates.
POINTS = """((domain, line) => {
    const path = document.querySelector(`.domain[data-domain='${domain}'] svg.trend path.${line}`);
    const numbers = (path ? path.getAttribute("d") : "").match(/-?[0-9.]+/g) || [];
    const points = [];
    for (let i = 0; i + 1 < numbers.length; i += 2) points.push([+numbers[i], +numbers[i + 1]]);
    return points;
})"""
# Whether the in-rate line has points above the rates panel's zero line.
RISEN = (
    "(domain) => { const zero = document.querySelector(`.domain[data-domain='${domain}'] "
    "svg.trend g.rates line.zero`); return zero !== null && "
    + POINTS
    + "(domain, 'in').filter(([, y]) => y < +zero.getAttribute('y1') - 0.5).length >= 2; }"
)


def _points(page: Page, domain: str, line: str) -> list[list[float]]:
    points: list[list[float]] = page.evaluate(POINTS, [domain, line])
    return points


@contextmanager
def _publishing(redis: Redis) -> Iterator[None]:
    """Valid events on every scan shard, about 50 a second, until the block ends."""
    stop = threading.Event()

    def publish() -> None:
        n = 0
        while not stop.is_set():
            job = f"rate-{n}"
            redis.xadd(
                SCAN.stream_for(job), {"job_id": job, "seq": 1, "stage": "vision", "status": "ok"}
            )
            n += 1
            stop.wait(0.02)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _errors_logged(page: Page) -> list[str]:
    """The page's console messages of type error, as they come."""
    errors: list[str] = []

    def collect(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", collect)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def _background(button: Locator) -> str:
    colour: str = button.evaluate("b => getComputedStyle(b).backgroundColor")
    return colour


def _colour(node: Locator) -> str:
    colour: str = node.evaluate("n => getComputedStyle(n).color")
    return colour


def _fits_the_width(page: Page) -> bool:
    fits: bool = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    return fits


def _widest(page: Page) -> list[str]:
    """What sticks out on the right (for the failure message)."""
    out: list[str] = page.evaluate(
        """() => [...document.querySelectorAll("body *")]
            .filter(n => n.getBoundingClientRect().right > window.innerWidth + 0.5)
            .slice(0, 8).map(n => n.tagName + "#" + n.id + "." + n.className + " "
                + Math.round(n.getBoundingClientRect().right))"""
    )
    return out


def _assert_the_header_fits(page: Page) -> None:
    """Every item of the header is inside the screen, and it takes at most two short lines."""
    items = page.locator("header > *:not([hidden]):not(.spacer)")
    boxes = [items.nth(i).bounding_box() for i in range(items.count())]
    width = page.evaluate("window.innerWidth")
    assert all(b is not None and b["x"] >= 0 and b["x"] + b["width"] <= width for b in boxes), boxes
    header = page.locator("header").bounding_box()
    assert header is not None
    assert header["height"] <= 72, header


def _wait_until_routed(server: ConsoleServer, job: str, *, events: int) -> None:
    url = f"{server.base_url}/console/api/jobs/scan/{job}"
    deadline = time.monotonic() + JOB_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        found = httpx.get(url, timeout=5.0, trust_env=False)
        if found.status_code == 200 and len(found.json()["history"]) >= events:
            return
        time.sleep(0.1)
    raise AssertionError(f"{job}: {events} events not routed in time")


def _token(**claims: object) -> str:
    return jwt.encode({"exp": int(time.time()) + 600, **claims}, SECRET, algorithm="HS256")


def _letter_of(job: str, stream: str) -> dict[str, str]:
    """A dead letter, as the router writes one, of a valid event (its cause since fixed)."""
    return {
        "stream": stream,
        "id": "1700000000000-0",
        "reason": "max_deliveries",
        "detail": "delivered 5 times",
        "deliveries": "5",
        "dead_at_ms": "1700000000000",
        "field:job_id": job,
        "field:seq": "7",
        "field:stage": "vision",
        "field:status": "completed",
        "field:progress": "25",
    }


class TestTheJobsControlMessages:
    def test_the_lookup_lists_each_message_with_its_state(
        self, page: Page, console_server: ConsoleServer
    ) -> None:
        job = job_on(1, "browser-controls")
        console_server.redis.xadd(
            SCAN.streams[1], {"job_id": job, "seq": "0", "stage": "queued", "status": "queued"}
        )
        _wait_until_routed(console_server, job, events=1)
        for n, kind in enumerate(["input", "cancel"]):
            body = {"request_id": f"r{n}"} | ({"input": "yes"} if kind == "input" else {})
            sent = httpx.post(f"{console_server.base_url}/api/v1/scan/{job}/{kind}", json=body,
                              trust_env=False)  # fmt: skip
            assert sent.status_code == 202, sent.text
        publisher = connect(console_server.redis_url, producer_config(domain="scan", shards=4))
        first = publisher.next_control(job, timeout_s=5)
        assert first is not None
        publisher.acknowledge(first)
        publisher.next_control(job, timeout_s=5)

        page.get_by_label("job id").fill(job)
        page.get_by_role("button", name="Look up").click()

        rows = page.locator("#job-controls tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0)).to_have_attribute("data-state", "acknowledged")
        expect(rows.nth(0)).to_contain_text("(not kept)")
        expect(rows.nth(1)).to_have_attribute("data-state", "delivered")
        expect(rows.nth(1)).to_contain_text("cancel")
        expect(page.locator("#job-controls caption")).to_contain_text("2 in all, 1 waiting")
