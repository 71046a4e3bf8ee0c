"""A browser listening as the reference chat frontend does, while a worker writes the reference
chat worker's entries byte for byte: the answer's text in the page is the worker's, from the
start, across dropped connections the browser resumes by itself, for a late joiner and after
the end.

`eco-router serve` (router inside) runs on a redis-server of the test's own; the worker is a
plain redis-py client in a thread, writing to the job's shard of `chat:events` at an LLM's
pace. Both of the worker's token paths are run, each on a server of its own: `plain` writes
the token entries only; `v2` also keeps its own `chat:tokens:{job}` stream and a
`chat:token_state:{job}` snapshot every 10 tokens, which the router must leave alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from playwright.sync_api import Browser, Page, Request
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from redis.client import Pipeline

from eco_router.domain.streams import StreamFamily
from eco_router.testing import RedisServer
from tests.browser.test_demo_page import JOB_TIMEOUT_MS, _demo_server, browser
from tests.tcp_relay import Mode, TcpRelay

__all__ = ["browser"]  # the shared chromium fixture, used by the tests below

CHAT = StreamFamily("chat:events", 4)
NODE = "answer"
FIRST_TOKEN_SEQ = 1001
TOKENS_PER_S = 200

# --- the reference chat worker ----------------------------------------------------------------

# Deltas that end inside a grapheme cluster, the next one completing it; each is valid UTF-8
# on its own, as an LLM's detokenized pieces are.
SPLIT_CLUSTERS: tuple[tuple[str, ...], ...] = (
    ("👩", "\u200d💻"),  # a ZWJ sequence: the woman, then the joiner and the laptop
    ("\u1112\u1161", "\u11ab\u1100\u1173\u11af"),  # 한글 in conjoining jamo, cut inside 한
    (" cafe", "\u0301"),  # an e, then its combining acute accent
    (" 🇰", "🇷"),  # a flag's two regional indicators
    (" 👍", "🏽"),  # a thumb, then its skin tone
    (" ♻", "\ufe0f"),  # a symbol, then its emoji presentation selector
    (" 👨\u200d", "👩\u200d", "👧"),  # a family, one member a delta
)
KOREAN = "안녕하세요! 페트병은 라벨을 떼고 깨끗이 헹군 뒤 투명 페트병 전용 수거함에 버리세요."
ENGLISH = " Plastic bottles go in the recycling bin once the label is off and they are rinsed."


def answer_deltas(count: int) -> list[str]:
    """`count` deltas of a Korean and English answer: Hangul two syllables a delta (a word
    split between tokens), English a word a delta, and a grapheme cluster split across deltas
    in every paragraph."""
    deltas: list[str] = []
    for paragraph in itertools.count(1):
        deltas.append(f"{paragraph}. ")
        deltas += [KOREAN[start : start + 2] for start in range(0, len(KOREAN), 2)]
        deltas += SPLIT_CLUSTERS[paragraph % len(SPLIT_CLUSTERS)]
        deltas += re.findall(r" ?\S+", ENGLISH)
        deltas.append("\n\n")
        if len(deltas) >= count:
            break
    return deltas[:count]


def token_seq(n: int) -> int:
    """The seq of token `n` (1-based)."""
    return FIRST_TOKEN_SEQ + n - 1


def text_up_to(deltas: Sequence[str], seq: int) -> str:
    """The answer's text up to the token of `seq`."""
    return "".join(deltas[: seq - FIRST_TOKEN_SEQ + 1])


def stage_entry(
    job_id: str,
    stage: str,
    status: str,
    seq: int,
    *,
    progress: int | None = None,
    result: dict[str, Any] | None = None,
    message: str = "",
) -> dict[str, str]:
    """A stage event exactly as the reference chat worker writes it: every field a string, an
    absent one "", no trace context."""
    return {
        "job_id": job_id,
        "stage": stage,
        "status": status,
        "seq": str(seq),
        "ts": str(time.time()),
        "progress": "" if progress is None else str(progress),
        "result": json.dumps(result, ensure_ascii=False) if result else "",
        "message": message,
        "trace_id": "",
        "span_id": "",
        "traceparent": "",
    }


def token_entry(job_id: str, seq: int, content: str) -> dict[str, str]:
    """A token exactly as the reference chat worker writes it, trace fields empty."""
    return {
        "job_id": job_id,
        "stage": "token",
        "status": "streaming",
        "seq": str(seq),
        "ts": str(time.time()),
        "content": content,
        "node": NODE,
        "trace_id": "",
        "span_id": "",
        "traceparent": "",
    }


class ReferenceChatWorker:
    """The reference chat worker answering one job: queued, intent, the answer's tokens at an
    LLM's pace, then done, on the job's shard of `chat:events`; on the `v2` path it also
    appends each token to `chat:tokens:{job}` and snapshots the text to
    `chat:token_state:{job}` every 10 tokens."""

    def __init__(
        self,
        url: str,
        job_id: str,
        deltas: Sequence[str],
        *,
        path: str = "plain",
        tokens_per_s: float | None = TOKENS_PER_S,
    ) -> None:
        self.url = url
        self.job_id = job_id
        self.deltas = list(deltas)
        self.v2 = path == "v2"
        self.tokens_per_s = tokens_per_s
        self.stream = CHAT.stream_for(job_id)
        self._written = 0
        self._progress = threading.Condition()

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    @property
    def last_token_seq(self) -> int:
        return token_seq(len(self.deltas))

    def run(self) -> None:
        """The whole answer, on a client of the worker's own."""
        client = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            self.write(client)
        finally:
            client.close()

    def write(self, client: redis.Redis) -> None:
        """Every write of the answer, in order, on `client` (a pipeline queues them all)."""
        self._stage(client, "queued", "started", 0, progress=0, message="대기 중")
        self._stage(client, "intent", "started", 10, progress=5, message="질문 파악 중")
        intent = {"intent": "recycling_question", "language": "ko"}
        self._stage(client, "intent", "completed", 11, progress=10, result=intent)
        self._stage(client, NODE, "started", 160, progress=10, message="답변 작성 중")
        self._tokens(client)
        self._stage(client, NODE, "completed", 161, progress=95)
        result = {"answer": self.text, "intent": intent["intent"]}
        self._stage(client, "done", "completed", 181, progress=100, result=result, message="완료")

    def wait_written(self, tokens: int, timeout_s: float = JOB_TIMEOUT_MS / 1000) -> None:
        """Block until the worker has written `tokens` tokens."""
        with self._progress:
            if not self._progress.wait_for(lambda: self._written >= tokens, timeout_s):
                raise AssertionError(f"the worker wrote {self._written} of {tokens} tokens")

    def _stage(self, client: redis.Redis, stage: str, status: str, seq: int, **fields: Any) -> None:
        client.xadd(self.stream, stage_entry(self.job_id, stage, status, seq, **fields))

    def _tokens(self, client: redis.Redis) -> None:
        started = time.monotonic()
        text = ""
        for n, delta in enumerate(self.deltas, start=1):
            if self.tokens_per_s is not None:
                time.sleep(max(0.0, started + n / self.tokens_per_s - time.monotonic()))
            seq = token_seq(n)
            text += delta
            if self.v2:
                self._v2_token(client, seq, delta, text, last=n == len(self.deltas))
            else:
                client.xadd(self.stream, token_entry(self.job_id, seq, delta))
            with self._progress:
                self._written = n
                self._progress.notify_all()

    def _v2_token(
        self, client: redis.Redis, seq: int, delta: str, text: str, *, last: bool
    ) -> None:
        # One round trip a token; a pipeline given to `write` holds these writes too.
        pipe = client if isinstance(client, Pipeline) else client.pipeline(transaction=False)
        pipe.xadd(self.stream, token_entry(self.job_id, seq, delta))
        pipe.xadd(
            f"chat:tokens:{self.job_id}",
            {"seq": str(seq), "content": delta, "node": NODE, "ts": str(time.time())},
        )
        if seq % 10 == 0 or last:
            state_key = f"chat:token_state:{self.job_id}"
            pipe.hset(
                state_key,
                mapping={"accumulated": text, "last_seq": str(seq), "completed": str(int(last))},
            )
            pipe.expire(state_key, 3600)
        if pipe is not client:
            pipe.execute()


@contextmanager
def answering(worker: ReferenceChatWorker) -> Iterator[ReferenceChatWorker]:
    """The worker's answer written in a thread of its own; its error, if any, is raised here."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            worker.run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=work, name=f"chat-worker-{worker.job_id}", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        thread.join(JOB_TIMEOUT_MS / 1000)
    if errors:
        raise AssertionError(f"the reference chat worker failed: {errors[0]!r}") from errors[0]
    assert not thread.is_alive(), "the reference chat worker did not finish"


def new_job() -> str:
    return f"chat-{uuid.uuid4().hex}"


# --- the page ---------------------------------------------------------------------------------

# The reference frontend's listeners; besides, every event handled is recorded (its name, id
# and which connection of the EventSource brought it).
LISTEN_AS_THE_REFERENCE_CHAT_FRONTEND = """
(jobId) => new Promise((resolve) => {
  window.__text = "";
  window.__events = [];
  window.__lastId = null;
  window.__opened = 0;
  window.__networkErrors = 0;
  window.__ended = false;
  const source = new EventSource(
    `/api/v1/chat/${encodeURIComponent(jobId)}/events`, { withCredentials: true });
  const seen = (name, message, data) => {
    window.__lastId = message.lastEventId;
    window.__events.push({ name, id: message.lastEventId, connection: window.__opened, data });
  };
  const end = () => { source.close(); window.__ended = true; };
  for (const name of ["queued", "intent", "answer", "needs_input"]) {
    source.addEventListener(name, (message) => seen(name, message, JSON.parse(message.data)));
  }
  source.addEventListener("token", (message) => {
    const data = JSON.parse(message.data);
    window.__text += data.content;
    seen("token", message, { seq: data.seq });
  });
  source.addEventListener("token_recovery", (message) => {
    const data = JSON.parse(message.data);
    window.__text = data.accumulated;
    seen("token_recovery", message, data);
    if (data.completed) end();
  });
  source.addEventListener("done", (message) => {
    seen("done", message, JSON.parse(message.data));
    end();
  });
  source.addEventListener("keepalive", (message) => seen("keepalive", message, null));
  source.onopen = () => { window.__opened += 1; resolve(true); };
  source.onerror = (message) => {
    // A network error: the browser reconnects by itself, sending its Last-Event-ID.
    if (message.data === undefined) window.__networkErrors += 1;
    else seen("error", message, JSON.parse(message.data));
    // Refused (not a 200 event stream): the browser gives up.
    if (source.readyState === EventSource.CLOSED) resolve(false);
  };
})
"""

TEXT_CHECK_IN_THE_PAGE = """
async () => {
  const bytes = new TextEncoder().encode(window.__text);
  const digest = await crypto.subtle.digest("SHA-1", bytes);
  const sha1 = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  return { bytes: bytes.length, sha1 };
}
"""


@pytest.fixture(scope="module", params=["plain", "v2"])
def token_path(request: pytest.FixtureRequest) -> str:
    """The reference worker's token path; each runs on a server of its own."""
    path: str = request.param
    return path


@pytest.fixture(scope="module")
def streams(token_path: str) -> Iterator[RedisServer]:
    """A redis-server for each token path: one that upsets the router upsets only its own."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory, streams: RedisServer) -> Iterator[str]:
    """`eco-router serve` (router inside, default EVENT_ROUTER_STREAMS) on the test's own
    redis-server."""
    yield from _demo_server(
        tmp_path_factory,
        in_memory=False,
        REDIS_STREAMS_URL=streams.url,
        EVENT_ROUTER_READ_BLOCK_MS="100",
    )


class ThreadedRelay:
    """tests.tcp_relay's relay in front of the gateway, on an event loop in a thread of its
    own (Playwright's sync API holds the test's thread); `cut` resets the browser's
    connections as a dropped network path would."""

    def __init__(self, upstream_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._relay = TcpRelay(upstream_port)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._relay.port}"

    def __enter__(self) -> ThreadedRelay:
        self._thread.start()
        self._call(self._relay.__aenter__())
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._call(self._relay.__aexit__(None, None, None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def cut(self) -> None:
        """Reset every open connection (RST); new ones pass at once."""

        async def cut_once() -> None:
            self._relay.set_mode(Mode.CUT)
            self._relay.set_mode(Mode.PASS)

        self._call(cut_once())

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)


@pytest.fixture
def relay(gateway_url: str) -> Iterator[ThreadedRelay]:
    port = urlsplit(gateway_url).port
    assert port is not None
    with ThreadedRelay(port) as opened:
        yield opened


@contextmanager
def chat_page(browser: Browser, base_url: str) -> Iterator[Viewer]:
    """A page of `base_url`'s origin (its EventSource is same-origin), recording the requests
    its EventSource makes."""
    context = browser.new_context(base_url=base_url)
    context.set_default_timeout(JOB_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto("/health")
        yield Viewer(page)
    finally:
        context.close()


class Viewer:
    """The reference frontend's page, read from the test."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self._requests: list[Request] = []
        page.on("request", self._record)

    def _record(self, request: Request) -> None:
        if "/events" in request.url:
            self._requests.append(request)

    @property
    def requests(self) -> list[tuple[str, str | None]]:
        """The URL and Last-Event-ID header of every request of the job's event stream, as
        sent (the network layer adds the header)."""
        return [(r.url, r.all_headers().get("last-event-id")) for r in self._requests]

    @property
    def statuses(self) -> list[int | None]:
        """The HTTP status of each of those requests (None: no response yet)."""
        return [None if (r := q.response()) is None else r.status for q in self._requests]

    def listen(self, job_id: str) -> None:
        """Open the job's stream as the reference frontend does; returns once it is open."""
        opened = self.page.evaluate(LISTEN_AS_THE_REFERENCE_CHAT_FRONTEND, job_id)
        assert opened is True, f"the stream was refused: HTTP {self.statuses}"

    def until_ended(self) -> None:
        """Until the page closed its stream (at done, or a completed recovery); on a timeout,
        fails with what the page got."""
        try:
            self.page.wait_for_function("window.__ended", polling=50)
        except PlaywrightTimeoutError:
            raise AssertionError(f"the stream did not end; {self._so_far()}") from None

    def _so_far(self) -> str:
        got = [(e["name"], e["id"]) for e in self.events()]
        return (
            f"the page got {len(got)} events, the last ones {got[-5:]}, from responses "
            f"{self.statuses} to {self.requests}"
        )

    def until_past(self, event_id: int, *, connection: int = 1) -> int:
        """Wait (every frame) until the page has an event past `event_id` on its
        `connection`-th connection or a later one; returns the id it has."""
        try:
            last: str = self.page.wait_for_function(
                """([after, connection]) => window.__opened >= connection
                     && window.__lastId !== null && Number(window.__lastId) > after
                     && window.__lastId""",
                arg=[event_id, connection],
                polling="raf",
            ).json_value()
        except PlaywrightTimeoutError:
            raise AssertionError(
                f"no event past {event_id} on connection {connection}; {self._so_far()}"
            ) from None
        return int(last)

    def until_opened(self, times: int) -> None:
        self.page.wait_for_function("n => window.__opened >= n", arg=times, polling="raf")

    def network_errors(self) -> int:
        errors: int = self.page.evaluate("window.__networkErrors")
        return errors

    def last_id(self) -> int:
        return int(self.page.evaluate("window.__lastId"))

    @property
    def text(self) -> str:
        text: str = self.page.evaluate("window.__text")
        return text

    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.page.evaluate("window.__events")
        return events

    def text_check(self) -> dict[str, Any]:
        check: dict[str, Any] = self.page.evaluate(TEXT_CHECK_IN_THE_PAGE)
        return check


def names_and_ids(events: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["name"], int(e["id"])) for e in events]


def the_done(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    [done] = [e["data"] for e in events if e["name"] == "done"]
    data: dict[str, Any] = done
    return data


def text_check_of(text: str) -> dict[str, Any]:
    data = text.encode()
    return {"bytes": len(data), "sha1": hashlib.sha1(data, usedforsecurity=False).hexdigest()}


def wait_until_done_routed(url: str, job_id: str) -> None:
    """Until the router has applied the job's done (its state is the done event)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_MS / 1000
        while time.monotonic() < deadline:
            state = client.get(f"chat:state:{job_id}")
            if state is not None and json.loads(state).get("stage") == "done":
                return
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError(f"{job_id}: done not routed in time")


STAGES_BEFORE_THE_ANSWER = [("queued", 0), ("intent", 10), ("intent", 11), ("answer", 160)]


def stages_after_the_answer(last_token_seq: int) -> list[tuple[str, int]]:
    """The answer's completed and done: ids next after the last token's (their seqs, 161
    and 181, are below it)."""
    return [("answer", last_token_seq + 1), ("done", last_token_seq + 2)]


# --- tests ------------------------------------------------------------------------------------


class TestAViewerFromTheStart:
    def test_gets_every_token_once_in_order_then_done(
        self, browser: Browser, gateway_url: str, streams: RedisServer, token_path: str
    ) -> None:
        worker = ReferenceChatWorker(streams.url, new_job(), answer_deltas(300), path=token_path)
        with chat_page(browser, gateway_url) as viewer:
            viewer.listen(worker.job_id)
            with answering(worker):
                viewer.until_ended()
            events = viewer.events()

            assert viewer.text == worker.text
            assert names_and_ids(events) == [
                *STAGES_BEFORE_THE_ANSWER,
                *(("token", token_seq(n)) for n in range(1, 301)),
                *stages_after_the_answer(worker.last_token_seq),
            ]

    def test_the_text_check_of_done_is_the_pages_own_text(
        self, browser: Browser, gateway_url: str, streams: RedisServer, token_path: str
    ) -> None:
        worker = ReferenceChatWorker(streams.url, new_job(), answer_deltas(300), path=token_path)
        with chat_page(browser, gateway_url) as viewer:
            viewer.listen(worker.job_id)
            with answering(worker):
                viewer.until_ended()
            done = the_done(viewer.events())

            assert viewer.text_check() == text_check_of(worker.text)
            assert done["text_check"] == {**text_check_of(worker.text), "truncated": False}
            assert done["result"]["answer"] == viewer.text


class TestConnectionsCutWhileTokensStream:
    def test_the_browser_resumes_by_itself_and_the_text_is_the_workers(
        self,
        browser: Browser,
        relay: ThreadedRelay,
        streams: RedisServer,
        token_path: str,
    ) -> None:
        # Two cuts, each at a random point of the answer: the first within its first 250
        # tokens, the second within 100 events of the browser's own reconnection. Chromium
        # reconnects 3 s after a cut (the gateway sends no `retry:`), so the answer lasts 6 s
        # at 200 tokens/s: tokens still stream when the second cut comes.
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        worker = ReferenceChatWorker(streams.url, new_job(), answer_deltas(1200), path=token_path)
        cut_after: list[int] = []
        with chat_page(browser, relay.base_url) as viewer:
            viewer.listen(worker.job_id)
            with answering(worker):
                viewer.until_past(token_seq(rng.randint(1, 250)))
                relay.cut()
                cut_after.append(viewer.last_id())
                resumed_at = viewer.until_past(cut_after[-1], connection=2)
                viewer.until_past(resumed_at + rng.randint(0, 100), connection=2)
                relay.cut()
                cut_after.append(viewer.last_id())
                viewer.until_ended()
            events = viewer.events()
            why = f"seed {seed}, cut after ids {cut_after}, requests {viewer.requests}"

            assert all(seq < worker.last_token_seq for seq in cut_after), why
            assert viewer.text == worker.text, why
            assert events[-1]["name"] == "done", why
            assert viewer.text_check() == text_check_of(worker.text), why
            # By itself: one EventSource, whose reconnections sent the last id it had.
            assert viewer.network_errors() == 2, why
            assert [last for _, last in viewer.requests] == [None, *map(str, cut_after)], why
            assert all("last_event_id" not in url for url, _ in viewer.requests), why

    def test_each_resume_gets_one_recovery_of_the_text_so_far_then_what_follows(
        self,
        browser: Browser,
        relay: ThreadedRelay,
        streams: RedisServer,
        token_path: str,
    ) -> None:
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        worker = ReferenceChatWorker(streams.url, new_job(), answer_deltas(1200), path=token_path)
        with chat_page(browser, relay.base_url) as viewer:
            viewer.listen(worker.job_id)
            with answering(worker):
                viewer.until_past(token_seq(rng.randint(1, 250)))
                relay.cut()
                cut_after = viewer.last_id()
                viewer.until_ended()
            events = viewer.events()
            why = f"seed {seed}, cut after id {cut_after}"

            first = [e for e in events if e["connection"] == 1]
            resumed = [e for e in events if e["connection"] == 2]
            assert int(first[-1]["id"]) == cut_after, why
            recovery = resumed[0]["data"]
            assert resumed[0]["name"] == "token_recovery", why
            assert [e["name"] for e in resumed].count("token_recovery") == 1, why
            assert recovery["accumulated"] == text_up_to(worker.deltas, recovery["last_seq"]), why
            assert recovery["nodes"] == {NODE: recovery["accumulated"]}, why
            assert (recovery["completed"], recovery["truncated"]) == (False, False), why
            # One id sequence over both connections: nothing twice, nothing after a gap.
            ids = [int(e["id"]) for e in events]
            assert ids == sorted(set(ids)), why
            after_recovery = ids[len(first) + 1 :]
            assert after_recovery == list(range(recovery["event_id"] + 1, ids[-1] + 1)), why


class TestALateJoiner:
    def test_gets_the_stages_so_far_one_recovery_then_the_live_tokens(
        self, browser: Browser, gateway_url: str, streams: RedisServer, token_path: str
    ) -> None:
        worker = ReferenceChatWorker(streams.url, new_job(), answer_deltas(300), path=token_path)
        with chat_page(browser, gateway_url) as viewer, answering(worker):
            worker.wait_written(150)
            viewer.listen(worker.job_id)
            viewer.until_ended()
            events = viewer.events()

            assert viewer.text == worker.text
            assert viewer.text_check() == text_check_of(worker.text)
            recovery = next(e["data"] for e in events if e["name"] == "token_recovery")
            assert names_and_ids(events) == [
                *STAGES_BEFORE_THE_ANSWER,
                ("token_recovery", recovery["last_seq"]),
                *(("token", seq) for seq in range(recovery["last_seq"] + 1, token_seq(301))),
                *stages_after_the_answer(worker.last_token_seq),
            ]
            assert recovery["accumulated"] == text_up_to(worker.deltas, recovery["last_seq"])
            assert token_seq(150) <= recovery["last_seq"] < worker.last_token_seq


class TestAViewerAfterTheEnd:
    def test_gets_the_stages_and_the_whole_text_in_one_recovery(
        self, browser: Browser, gateway_url: str, streams: RedisServer, token_path: str
    ) -> None:
        worker = ReferenceChatWorker(
            streams.url, new_job(), answer_deltas(300), path=token_path, tokens_per_s=None
        )
        with answering(worker):
            pass
        wait_until_done_routed(streams.url, worker.job_id)
        with chat_page(browser, gateway_url) as viewer:
            viewer.listen(worker.job_id)
            viewer.until_ended()
            events = viewer.events()

            assert viewer.text == worker.text
            assert viewer.text_check() == text_check_of(worker.text)
            assert the_done(events)["text_check"] == {
                **text_check_of(worker.text),
                "truncated": False,
            }
            assert names_and_ids(events) == [
                *STAGES_BEFORE_THE_ANSWER,
                ("token_recovery", worker.last_token_seq),
                *stages_after_the_answer(worker.last_token_seq),
            ]
