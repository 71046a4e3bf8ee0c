"""The chat rig of the fault suite: answers written token by token, viewers that rebuild them.

Each answer is what the reference chat worker writes on its job's shard of `chat:events`,
through the producer SDK: `queued` (seq 0), `answer` started (160), tokens from seq 1001
(`node=answer`), `answer` completed (161), `done` (181). Some answers' tasks are retried
part-way: the retry writes its own text as attempt 1, from seq 1001 again. Some tokens are
written twice (a raw XADD of the same fields, as a worker retrying its write without the
SDK's idempotency would). Token n of attempt a carries ` a.n안`, so a text tells which tokens
it holds, and in which order.

Each answer has a viewer from before its first entry: a browser tab on
`/api/v1/chat/{job}/events` that rebuilds the text as the reference frontend does (`token`
appends `content`, `token_recovery` replaces it with `accumulated`) and, when its stream
drops, reconnects with the last id it got as Last-Event-ID, until `done`. Once every answer
is over, a late viewer opens each job's stream afresh.

The checks, from the outside:

- **The text, whole, once.** Every viewer, and every late one, holds exactly the text of the
  answer's last attempt: no token lost, none twice, none of an earlier attempt; its `done`
  came once, last, with a `text_check` of that text; it got the job's four stage events in
  order and never a frame at or below an id it already had. The job's stored text is that
  text too.
- **Nothing stranded.** No chat entry is left pending in the group; none is dead-lettered.

A token is counted at the viewers, not on Pub/Sub: a token a router applied and died before
publishing (or could not publish while Pub/Sub was down) is never published, by design; it
reaches the viewers in a `token_recovery` the gateway sends when the next event tells it
that something is missing. So `expected` counts the tokens of every answer's final text,
`published` those its viewer holds, `lost` those it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

from eco_router.adapters.dead_letter_format import read_dead_letter
from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.application.stopping import cancel_and_wait
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.producer import AsyncStreamPublisher, producer_config
from tests.faults.harness import (
    SSE_KEEPALIVE_S,
    Figures,
    launch_gateway,
    router_env,
    until,
)
from tests.integration.sse_client import SseEvent, SseStream, open_sse
from tests.integration.support import (
    GROUP,
    PubSubCollector,
    WorkerProcess,
    pending_by_consumer,
    pending_count,
)
from tests.integration.test_gateway import Gateway

CONFIG = producer_config(domain="chat")
CHAT = CONFIG.family
NODE = "answer"
# The stage events of an answer, in order: queued, answer started and completed, done.
STAGE_SEQS = [0, 160, 161, 181]
_TOKEN = re.compile(r" (\d+)\.(\d+)안")
# Once every answer is written, every viewer has its `done` within this long: an end that
# only the gateway's quiet re-check (EVENT_ROUTER_SSE_RECHECK_S, 60 s) delivers is too late.
ENDED_WITHIN_S = 10.0

_router_names = itertools.count(1)

Token = tuple[int, int]  # (attempt, n)


def token_content(attempt: int, n: int) -> str:
    """The delta of token `n` (from 1) of `attempt`: unique within its answer, multi-byte."""
    return f" {attempt}.{n}안"


def tokens_in(text: str) -> list[Token]:
    """The tokens a text holds, in order."""
    return [(int(a), int(n)) for a, n in _TOKEN.findall(text)]


@dataclass(frozen=True, slots=True)
class ChatSizes:
    """How many answers, how long each, how fast, and the share retried or written twice."""

    name: str
    answers: int
    tokens: int
    pace_s: float = 0.08
    # Answers start within this long of each other.
    stagger_s: float = 3.0
    retried: float = 0.125
    duplicates: float = 0.03

    def params(self) -> dict[str, Any]:
        shown = {k: v for k, v in asdict(self).items() if k != "name"}
        return shown | {"size": self.name, "settings": "documented defaults"}


@dataclass(frozen=True, slots=True)
class ChatScenario:
    """One chat fault scenario at one load size; `name` names its result file."""

    number: int
    slug: str
    title: str
    sizes: ChatSizes

    @property
    def name(self) -> str:
        return f"{self.number:02d}-{self.slug}-{self.sizes.name}"


@dataclass(slots=True)
class Answer:
    """What the producer wrote for one job: each attempt's text, and how many entries;
    `attempts`: how many runs its task will take, once it has started."""

    job_id: str
    attempts: int = 1
    texts: list[str] = field(default_factory=lambda: [""])
    tokens: list[list[Token]] = field(default_factory=lambda: [[]])
    entries: int = 0
    finished: bool = False

    @property
    def text(self) -> str:
        return self.texts[-1]

    @property
    def attempt(self) -> int:
        return len(self.texts) - 1

    @property
    def final_tokens(self) -> list[Token]:
        return self.tokens[-1]

    def reached(self) -> Token:
        """The last token written so far ((attempt, 0) before the attempt's first)."""
        return self.tokens[-1][-1] if self.tokens[-1] else (self.attempt, 0)


class ChatLoad:
    """The answers, each written by a task of its own through the producer SDK."""

    def __init__(self, url: str, sizes: ChatSizes, *, stem: str, seed: int = 11) -> None:
        self.sizes = sizes
        self._redis = Redis.from_url(url, socket_timeout=5.0)
        self._publisher = AsyncStreamPublisher(self._redis, CONFIG)
        rng = random.Random(seed)
        self.answers = [Answer(f"{stem}-{n:03d}") for n in range(sizes.answers)]
        self._rngs = {a.job_id: random.Random(rng.random()) for a in self.answers}
        self._tasks: list[asyncio.Task[None]] = []
        self.errors: list[str] = []

    @property
    def tokens_written(self) -> int:
        return sum(len(tokens) for a in self.answers for tokens in a.tokens)

    @property
    def total_tokens(self) -> int:
        return self.sizes.answers * self.sizes.tokens

    @property
    def done(self) -> bool:
        return bool(self._tasks) and all(t.done() for t in self._tasks)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._answer(a, self._rngs[a.job_id]), name=a.job_id)
            for a in self.answers
        ]

    async def until_written(self, share: float, timeout_s: float = 60.0) -> bool:
        """Until `share` of the load's first-attempt tokens are written (the fault's moment)."""
        return await until(
            lambda: self.tokens_written >= share * self.total_tokens,
            timeout_s=timeout_s,
            every_s=0.02,
        )

    async def finish(self, timeout_s: float) -> bool:
        finished = await until(lambda: self.done, timeout_s=timeout_s)
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.errors.append(repr(task.exception()))
        return finished and not self.errors

    async def aclose(self) -> None:
        await cancel_and_wait(self._tasks)
        await self._redis.aclose()

    async def retry_last_tokens(self) -> int:
        """Every answer in its last attempt with tokens still to come gets its last token
        written again (a raw XADD of the same fields, as a worker retrying its write without
        the SDK's idempotency would): a duplicate, never in the text. Returns how many."""
        retried = 0
        for answer in self.answers:
            written = len(answer.tokens[-1])
            if answer.attempt != answer.attempts - 1 or not 0 < written < self.sizes.tokens:
                continue
            attempt, n = answer.tokens[-1][-1]
            content = token_content(attempt, n)
            seq = FIRST_TOKEN_SEQ + n - 1
            entry = CONFIG.token(answer.job_id, content, seq=seq, node=NODE, attempt=attempt)
            fields: dict[Any, Any] = dict(entry.fields)
            await self._redis.xadd(entry.stream, fields)
            answer.entries += 1
            retried += 1
        return retried

    async def _answer(self, answer: Answer, rng: random.Random) -> None:
        sizes = self.sizes
        await asyncio.sleep(rng.uniform(0, sizes.stagger_s))
        await self._stage(answer, "queued", "started", 0)
        await self._stage(answer, NODE, "started", 160)
        retry_after = rng.randint(sizes.tokens // 4, sizes.tokens // 2)
        attempts = answer.attempts = 2 if rng.random() < sizes.retried else 1
        for attempt in range(attempts):
            if attempt:
                answer.texts.append("")
                answer.tokens.append([])
            last = retry_after if attempt < attempts - 1 else sizes.tokens
            for n in range(1, last + 1):
                await asyncio.sleep(sizes.pace_s * rng.uniform(0.5, 1.5))
                await self._token(answer, attempt, n, twice=rng.random() < sizes.duplicates)
        await self._stage(answer, NODE, "completed", 161)
        await self._stage(answer, "done", "completed", 181)
        answer.finished = True

    async def _stage(self, answer: Answer, stage: str, status: str, seq: int) -> None:
        await self._publisher.publish_stage_event(answer.job_id, stage, status, seq=seq)
        answer.entries += 1

    async def _token(self, answer: Answer, attempt: int, n: int, *, twice: bool) -> None:
        content = token_content(attempt, n)
        seq = FIRST_TOKEN_SEQ + n - 1
        await self._publisher.publish_token(
            answer.job_id, content, seq=seq, node=NODE, attempt=attempt
        )
        answer.entries += 1
        if twice:
            entry = CONFIG.token(answer.job_id, content, seq=seq, node=NODE, attempt=attempt)
            fields: dict[Any, Any] = dict(entry.fields)
            await self._redis.xadd(entry.stream, fields)
            answer.entries += 1
        answer.texts[-1] += content
        answer.tokens[-1].append((attempt, n))


class ChatViewer:
    """A browser tab on one job's chat stream, rebuilding its text as the reference frontend
    does; it reconnects with the last id it got until `done` (`once`: a single stream read
    to its end, for a late viewer)."""

    def __init__(self, base_url: Callable[[], str], job_id: str, *, once: bool = False) -> None:
        self._base_url = base_url
        self.job_id = job_id
        self._once = once
        self.text = ""
        self.last_id: int | None = None
        self.stage_seqs: list[int] = []
        self.dones: list[dict[str, Any]] = []
        # Frames at or below an id already got: the gateway must never send one.
        self.repeated = 0
        self.recoveries = 0
        self.token_frames = 0
        self.connections = 0
        self.last_event = ""
        self._task: asyncio.Task[None] | None = None

    @property
    def finished(self) -> bool:
        return bool(self.dones)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"chat-viewer-{self.job_id}")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    def reached(self) -> Token | None:
        """The last token of the text it holds."""
        held = tokens_in(self.text)
        return held[-1] if held else None

    async def _run(self) -> None:
        path = f"/api/v1/chat/{self.job_id}/events"
        timeout = httpx.Timeout(3 * SSE_KEEPALIVE_S)
        while not self.finished:
            headers = {"Last-Event-ID": str(self.last_id)} if self.last_id is not None else {}
            self.connections += 1
            with contextlib.suppress(httpx.HTTPError):
                async with (
                    httpx.AsyncClient(
                        base_url=self._base_url(), timeout=timeout, trust_env=False
                    ) as http,
                    open_sse(http, path, headers=headers) as stream,
                ):
                    if stream.status_code == 200:
                        await self._read(stream)
            if self._once:
                return
            if not self.finished:
                await asyncio.sleep(0.2)

    async def _read(self, stream: SseStream) -> None:
        while (event := await stream.next_event(timeout_s=3600)) is not None:
            if event.id is not None:
                self._take(event)
            if event.terminal:
                return

    def _take(self, event: SseEvent) -> None:
        if self.last_id is not None and event.seq <= self.last_id:
            self.repeated += 1
            return
        self.last_id = event.seq
        self.last_event = event.event
        data = event.json()
        if event.event == "token":
            self.text += data["content"]
            self.token_frames += 1
        elif event.event == "token_recovery":
            self.text = data["accumulated"]
            self.recoveries += 1
        else:
            self.stage_seqs.append(int(data["seq"]))
        if event.event == "done":
            self.dones.append(data)


@dataclass(slots=True)
class ChatFindings:
    """What the final checks found; empty means the invariant holds."""

    # Where a viewer's text first differs from the answer's: (at, the viewer's, the answer's).
    wrong_texts: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    lost_tokens: dict[str, list[Token]] = field(default_factory=dict)
    repeated_tokens: dict[str, list[Token]] = field(default_factory=dict)
    stale_tokens: dict[str, list[Token]] = field(default_factory=dict)
    repeated_frames: dict[str, int] = field(default_factory=dict)
    no_done: list[str] = field(default_factory=list)
    done_not_once_or_last: dict[str, str] = field(default_factory=dict)
    wrong_text_checks: dict[str, Any] = field(default_factory=dict)
    wrong_stage_events: dict[str, list[int]] = field(default_factory=dict)
    wrong_stored_texts: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    pending: int = 0
    dead_letters: list[tuple[str, str, str]] = field(default_factory=list)
    load_errors: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(getattr(self, name) for name in self.__dataclass_fields__)


class ChatRig:
    """Router processes (workers and one gateway) on a pair of servers, the answers and
    their viewers; the routers run with the documented defaults, only addresses and names
    set (`harness.router_env`)."""

    def __init__(
        self, log_dir: Path, scenario: ChatScenario, *, streams_url: str, pubsub_url: str
    ) -> None:
        self.log_dir = log_dir
        self.sizes = scenario.sizes
        self.streams_url = streams_url
        self.pubsub_url = pubsub_url
        self.redis = Redis.from_url(streams_url, socket_timeout=5.0)
        self.load = ChatLoad(streams_url, scenario.sizes, stem=f"{scenario.number:02d}-chat")
        self.workers: list[WorkerProcess] = []
        self.gateways: list[Gateway] = []
        self.viewers: list[ChatViewer] = []
        self.late_viewers: list[ChatViewer] = []
        self.figures = Figures(
            scenario=scenario.name, title=scenario.title, params=scenario.sizes.params()
        )
        self.findings = ChatFindings()
        # What the routers publish, as a subscriber of the Pub/Sub server hears it.
        self.collector = PubSubCollector(pubsub_url)
        self._collecting = False
        self._recovery: asyncio.Task[None] | None = None
        self._recovered = False

    # -- set-up --

    async def start(
        self, *, workers: int = 2, pubsub_urls: Sequence[str] = (), release: Path | None = None
    ) -> list[WorkerProcess]:
        """The collector, `workers` workers and the gateway (a router too), all of `release`
        (see `harness.router_env`); the workers once ready. `pubsub_urls`: what each worker
        dials for Pub/Sub instead of the server (a relay)."""
        await self.collector.__aenter__()
        self._collecting = True
        started = [
            self.spawn_worker(pubsub_urls[n] if n < len(pubsub_urls) else self.pubsub_url, release)
            for n in range(workers)
        ]
        await self.start_gateway(release)
        await asyncio.gather(*(w.until_ready() for w in started))
        return started

    def spawn_worker(self, pubsub_url: str, release: Path | None = None) -> WorkerProcess:
        name = f"chat-worker-{next(_router_names)}"
        worker = WorkerProcess.spawn(
            self._env(name, pubsub_url, release), self.log_dir / f"{name}.log"
        )
        self.workers.append(worker)
        return worker

    async def start_worker(self, release: Path | None = None) -> WorkerProcess:
        return await self.spawn_worker(self.pubsub_url, release).until_ready()

    async def start_gateway(self, release: Path | None = None) -> Gateway:
        """A gateway that takes over the address viewers (re)connect to."""
        env = self._env(f"chat-gateway-{next(_router_names)}", self.pubsub_url, release)
        gateway = await asyncio.to_thread(launch_gateway, self.log_dir, env)
        self.gateways.append(gateway)
        return gateway

    def _env(self, name: str, pubsub_url: str, release: Path | None = None) -> dict[str, str]:
        return router_env(
            streams_url=self.streams_url,
            pubsub_url=pubsub_url,
            name=name,
            settings={},
            release=release,
        )

    @property
    def gateway(self) -> Gateway:
        return self.gateways[-1]

    @property
    def routers(self) -> list[WorkerProcess]:
        return [p for p in [*self.workers, *self.gateways] if p.exit_code is None]

    async def start_load(self) -> None:
        """A viewer on every answer first, then the answers."""
        for answer in self.load.answers:
            viewer = ChatViewer(lambda: self.gateway.base_url, answer.job_id)
            viewer.start()
            self.viewers.append(viewer)
        await until(lambda: all(v.connections for v in self.viewers), timeout_s=10)
        self.load.start()

    # -- what the servers hold --

    async def chat_owners(self) -> dict[str, str]:
        """Chat shard → the router holding its lease now."""
        keys = GroupKeys(GROUP)
        owners = {}
        for stream in CHAT.streams:
            owner = await self.redis.hget(keys.lease(stream), "owner")
            if owner is not None:
                owners[stream] = owner.decode()
        return owners

    async def pending_of(self, consumer: str) -> int:
        """Chat entries read by `consumer` and not acked."""
        return (await pending_by_consumer(self.redis, CHAT.streams)).get(consumer, 0)

    async def pending_tokens_of(self, consumer: str) -> list[tuple[str, int, int]]:
        """Of those, the tokens of their answer's last attempt: (job id, attempt, seq)."""
        final = {a.job_id: a.attempts - 1 for a in self.load.answers}
        found = []
        for stream in CHAT.streams:
            pending = await self.redis.xpending_range(
                stream, GROUP, min="-", max="+", count=1000, consumername=consumer
            )
            for item in pending:
                entry_id = item["message_id"]
                for _, fields in await self.redis.xrange(stream, entry_id, entry_id):
                    if fields.get(b"stage") != b"token":
                        continue
                    job, attempt = fields[b"job_id"].decode(), int(fields.get(b"attempt", b"0"))
                    if attempt == final[job]:
                        found.append((job, attempt, int(fields[b"seq"])))
        return found

    async def applied_tokens(
        self, tokens: list[tuple[str, int, int]]
    ) -> list[tuple[str, int, int]]:
        """Of `tokens`, those already in their job's text (a pending entry may be read and not
        yet applied: its router is stuck in an earlier batch's publish)."""
        applied = []
        for job, attempt, seq in tokens:
            known = await self.redis.hmget(f"{CHAT.domain}:text_state:{job}", "attempt", "seq")
            if known[0] is not None and int(known[0]) == attempt and int(known[1]) >= seq:
                applied.append((job, attempt, seq))
        return applied

    def published_tokens(self) -> set[tuple[str, int, int]]:
        """(job id, attempt, seq) of every token heard on Pub/Sub."""
        return {
            (str(p["job_id"]), int(p.get("attempt", 0)), int(p["seq"]))
            for p in (m.payload for m in self.collector.messages)
            if p.get("stage") == "token"
        }

    async def metric_sum(self, sample: str, **labels: str) -> float:
        values = await asyncio.gather(*(p.metric(sample, **labels) for p in self.routers))
        return sum(values)

    # -- the fault and the recovery --

    def recover_from(self, origin: str) -> None:
        """Start the recovery clock now: recovered once every viewer holds the text as far
        as its answer had been written at this moment (or further)."""
        started = time.monotonic()
        self.figures.recovery_from = origin
        due = {a.job_id: a.reached() for a in self.load.answers}

        def recovered() -> bool:
            for viewer in self.viewers:
                owed, held = due[viewer.job_id], viewer.reached()
                if owed[1] and not viewer.finished and (held is None or held < owed):
                    return False
            return True

        async def clock() -> None:
            if await until(recovered, timeout_s=600, every_s=0.02):
                self.figures.recovery_s = round(time.monotonic() - started, 3)
                self._recovered = True

        self._recovery = asyncio.create_task(clock(), name="chat-recovery-clock")

    def require(self, condition: bool, what: str) -> None:
        if not condition:
            self.findings.extra.append(what)

    # -- the end --

    async def settle(self, *, timeout_s: float = 90.0) -> Figures:
        """Let the answers finish and the viewers end, send the late viewers, then check."""
        findings = self.findings
        if not await self.load.finish(timeout_s):
            findings.load_errors = self.load.errors or ["the answers were not all written"]
        written = time.monotonic()
        await until(lambda: all(v.finished for v in self.viewers), timeout_s=90)
        ended_s = round(time.monotonic() - written, 2)
        self.figures.params |= {"viewers_ended_s_after_the_last_entry": ended_s}
        self.require(
            ended_s <= ENDED_WITHIN_S,
            f"viewers still open {ended_s} s after the last entry (bound {ENDED_WITHIN_S} s)",
        )
        await until(self._nothing_pending, timeout_s=20)
        for answer in self.load.answers:
            late = ChatViewer(lambda: self.gateway.base_url, answer.job_id, once=True)
            late.start()
            self.late_viewers.append(late)
        await until(lambda: all(v.finished for v in self.late_viewers), timeout_s=30)
        if self._recovery is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await asyncio.shield(self._recovery)
            self._recovery.cancel()
        if not self._recovered:
            findings.extra.append("never recovered from the fault")

        answers = {a.job_id: a for a in self.load.answers}
        for viewer in [*self.viewers, *self.late_viewers]:
            self._check_viewer(viewer, answers[viewer.job_id])
        await self._check_stored_texts()
        findings.pending = await pending_count(self.redis, CHAT.streams)
        findings.dead_letters = await self._dead_letters()

        figures = self.figures
        everyone = [*self.viewers, *self.late_viewers]
        expected = sum(len(answers[v.job_id].final_tokens) for v in everyone)
        lost = sum(len(t) for t in findings.lost_tokens.values())
        repeated = sum(len(t) for t in findings.repeated_tokens.values())
        repeated += sum(findings.repeated_frames.values())
        repeated += sum(max(0, len(v.dones) - 1) for v in everyone)
        figures.params |= {
            "viewers": len(self.viewers),
            "late_viewers": len(self.late_viewers),
            "tokens_written": self.load.tokens_written,
            "retried_answers": sum(a.attempt > 0 for a in self.load.answers),
            "token_frames_received": sum(v.token_frames for v in self.viewers),
            "token_recoveries_received": sum(v.recoveries for v in self.viewers),
            "sse_reconnects": sum(v.connections - 1 for v in self.viewers),
            "text_mismatches_at_viewers": len(findings.wrong_texts),
            "stored_text_mismatches": len(findings.wrong_stored_texts),
        }
        figures.sent = sum(a.entries for a in self.load.answers)
        figures.expected = expected
        figures.published = expected - lost
        figures.lost = lost
        figures.duplicated_to_clients = repeated
        figures.dead_lettered = len(findings.dead_letters)
        return figures

    def _check_viewer(self, viewer: ChatViewer, answer: Answer) -> None:
        findings, job = self.findings, viewer.job_id
        label = f"{job} (late)" if viewer in self.late_viewers else job
        held = tokens_in(viewer.text)
        owed = answer.final_tokens
        if viewer.text != answer.text:
            findings.wrong_texts[label] = _first_difference(viewer.text, answer.text)
        if missing := sorted(set(owed) - set(held)):
            findings.lost_tokens[label] = missing
        if twice := sorted(t for t, n in Counter(held).items() if n > 1):
            findings.repeated_tokens[label] = twice
        if stale := [t for t in held if t[0] != answer.attempt]:
            findings.stale_tokens[label] = stale
        if viewer.repeated:
            findings.repeated_frames[label] = viewer.repeated
        if not viewer.dones:
            findings.no_done.append(label)
            return
        if len(viewer.dones) != 1 or viewer.last_event != "done":
            findings.done_not_once_or_last[label] = f"{len(viewer.dones)}, last {viewer.last_event}"
        text = answer.text.encode()
        check = viewer.dones[0].get("text_check")
        want = {"bytes": len(text), "sha1": hashlib.sha1(text).hexdigest(), "truncated": False}
        if check != want:
            findings.wrong_text_checks[label] = check
        if viewer.stage_seqs != STAGE_SEQS:
            findings.wrong_stage_events[label] = viewer.stage_seqs

    async def _check_stored_texts(self) -> None:
        for answer in self.load.answers:
            raw = await self.redis.get(JobKeys.in_family(CHAT, answer.job_id).text)
            stored = None if raw is None else raw.decode()
            if stored != answer.text:
                self.findings.wrong_stored_texts[answer.job_id] = (
                    answer.text[-80:],
                    None if stored is None else stored[-80:],
                )

    async def _nothing_pending(self) -> bool:
        return await pending_count(self.redis, CHAT.streams) == 0

    async def _dead_letters(self) -> list[tuple[str, str, str]]:
        raw = await self.redis.xrange(CHAT.dead_letter_stream)
        letters = [read_dead_letter(i.decode(), fields) for i, fields in raw]
        return [(d.stream, d.entry_id, d.reason) for d in letters]

    def conclude(self) -> None:
        """Write the result file, then assert the invariants and the scenario's checks."""
        findings, figures = self.findings, self.figures
        figures.passed = findings.ok
        figures.write()
        logs = "\n".join(p.log_tail(15) for p in [*self.workers, *self.gateways])
        assert not findings.load_errors, (findings.load_errors, logs)
        # The text, whole, once, at every viewer.
        assert not findings.wrong_texts, findings.wrong_texts
        assert not findings.lost_tokens, findings.lost_tokens
        assert not findings.repeated_tokens, findings.repeated_tokens
        assert not findings.stale_tokens, findings.stale_tokens
        assert not findings.repeated_frames, findings.repeated_frames
        assert not findings.no_done, (findings.no_done, logs)
        assert not findings.done_not_once_or_last, findings.done_not_once_or_last
        assert not findings.wrong_text_checks, findings.wrong_text_checks
        assert not findings.wrong_stage_events, findings.wrong_stage_events
        assert not findings.wrong_stored_texts, findings.wrong_stored_texts
        assert figures.lost == 0
        assert figures.duplicated_to_clients == 0
        # Nothing stranded.
        assert findings.pending == 0, logs
        assert not findings.dead_letters, findings.dead_letters
        assert not findings.extra, findings.extra
        assert figures.passed

    async def aclose(self) -> None:
        for viewer in [*self.viewers, *self.late_viewers]:
            await viewer.aclose()
        await self.load.aclose()
        if self._recovery is not None:
            self._recovery.cancel()
        if self._collecting:
            await self.collector.__aexit__(None, None, None)
        for worker in self.workers:
            worker.ensure_dead()
        for gateway in self.gateways:
            await asyncio.to_thread(gateway.stop)
        await self.redis.aclose()


def _first_difference(held: str, written: str) -> tuple[int, str, str]:
    """Where `held` first differs from `written`, and a few tokens of each from there."""
    at = next(
        (n for n, (a, b) in enumerate(zip(held, written, strict=False)) if a != b),
        min(len(held), len(written)),
    )
    start = max(0, at - 12)
    return at, held[start : at + 36], written[start : at + 36]
