"""Use case: simulate workers running whole pipelines, so people can watch the system move."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eco_router.application.control_inbox import ControlInbox
from eco_router.application.ports import ProgressPublisher
from eco_router.domain.control import ControlKind
from eco_router.domain.progress import StageEvent, StagePlan, Status

LABELS = ("cat", "dog", "bicycle", "receipt", "invoice", "screenshot", "landscape")

# Numbered as the reference chat worker numbers its 17 stages (its sub-agents, 30 to 130,
# named here by number): intent 10/11, answer 160/161, done 181. A chat job passes these
# seqs itself, so any publisher takes it, whatever its own plan.
CHAT_PLAN = StagePlan(
    (
        "intent",
        "vision",
        *(f"agent_{n}" for n in range(1, 12)),
        "aggregator",
        "feedback",
        "answer",
        "eval",
    )
)
CHAT_NODE = "answer"
# What a chat job answers: Korean, English and emoji, 150-300 tokens each.
CHAT_ANSWERS = (
    "안녕하세요! 👋 Here is how eco-router streams this answer to you. 작업자(worker)가 모델의 "
    "토큰을 받으면 Redis Stream 에 하나씩 씁니다 ✍️, and the router appends each delta to the "
    "job's text, keeping it in Redis so nothing is lost. 브라우저는 Server-Sent Events 로 토큰을 "
    "받고, 연결이 끊어져도 🔌 Last-Event-ID 로 다시 연결하면 지금까지의 전체 텍스트를 "
    'token_recovery 로 한 번에 받은 뒤 이어서 받습니다. Try it: press "Drop the connection" '
    "while I am still typing ⌨️ and watch the text pick up exactly where it was, 글자 하나 "
    "빠지거나 겹치지 않고요 ✅. Each entry is written once per (job, attempt, seq), so a retried "
    "network call never doubles a word, 그리고 재시도된 작업(attempt 1, 2…)은 텍스트를 처음부터 "
    "다시 씁니다 🔁. That is all for now — 감사합니다! 🙏",
    "좋은 질문이에요 🤔 Let me think out loud. 오늘 서울 날씨는 맑고 ☀️ 기온은 23°C 정도라서 "
    "산책하기 딱 좋아요 🚶. If you go out, 한강 공원에서 자전거 🚲 를 타거나 치맥 🍗🍺 을 즐겨 "
    "보세요. A light jacket helps after sunset 🌇, 저녁에는 바람이 조금 불거든요 🌬️. Tokens like "
    "these arrive a few at a time; the producer merges those that come within 50 ms into one "
    "entry, 그래서 Redis 에 쓰는 횟수는 토큰 수보다 적습니다 📉. When the answer ends, the done "
    "event carries the text's size and SHA-1, 브라우저가 자기 텍스트를 검증할 수 있도록요 🔍. "
    "즐거운 하루 보내세요! 😊 Have a great day! 🌈",
)
# The question a chat job started with `ask` puts to its user, one option per answer above.
CHAT_QUESTION = "Which answer would you like?"
CHAT_OPTIONS = ("a greeting", "the weather")
# How long it waits for the reply before it picks an answer itself.
ASK_TIMEOUT_S = 120.0
# One delta: optional spaces, then up to three characters, as a model's tokens go.
_TOKEN = re.compile(r"\s*\S{1,3}|\s+")


def answer_tokens(text: str) -> list[str]:
    """`text` cut into model-like deltas, which join back into it."""
    return _TOKEN.findall(text)


@dataclass(slots=True)
class DemoTally:
    """What the simulation has done so far."""

    jobs_started: int = 0
    jobs_finished: int = 0
    jobs_failed: int = 0
    events: int = 0
    retries: int = 0
    # Token entries of chat jobs' answers (deltas merged by the producer count once).
    tokens: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        return self.events / max(time.monotonic() - self.started_at, 1e-9)


class _Pacer:
    """Spreads publishes evenly at `rate` per second across every simulated job."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate
        self._next = time.monotonic()
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        async with self._lock:
            now = time.monotonic()
            self._next = max(self._next + self._interval, now)
            delay = self._next - now
        if delay > 0:
            await asyncio.sleep(delay)


class RunDemoJobs:
    """Run `jobs` simulated pipelines, `concurrency` at a time, at about `rate` events/s.

    - Each job: queued, then every stage started and completed with rising progress, and done
      with a result; about one job in `failure_every` fails at a random stage instead.
    - About one publish in `retry_every` is sent twice, as a retried worker would; the
      producer's idempotency keeps it to one entry.
    - Given a `chat_publisher`, every second job is a chat job: queued, intent started and
      completed, answer started, an answer of 150-300 tokens streamed at about
      `tokens_per_s` (node `answer`), answer completed, and done with {"answer_chars": n};
      failing, it stops halfway through its answer with answer failed. Its seqs are those of
      the reference chat worker (`CHAT_PLAN`), passed explicitly.
    - Stops early, without half-written events, when `stop` is set; a chat answer stops
      between two tokens.
    - Given `controls` (the chat domain's inbox), a chat job started alone (`run_one`, the
      page's) stops typing once a viewer cancels it, acknowledges what it was sent, and ends
      with `done` / `cancelled`; with `ask` it first asks its user which answer to give
      (`needs_input`, waiting up to `ASK_TIMEOUT_S`, then picking one itself).
    """

    def __init__(
        self,
        *,
        publisher: ProgressPublisher,
        stages: Sequence[str],
        rate: float,
        concurrency: int = 8,
        failure_every: int = 10,
        retry_every: int = 12,
        seed: int | None = None,
        chat_publisher: ProgressPublisher | None = None,
        tokens_per_s: float = 25.0,
        controls: ControlInbox | None = None,
    ) -> None:
        self._publisher = publisher
        self._chat_publisher = chat_publisher
        self._controls = controls
        self._token_interval_s = 1.0 / tokens_per_s
        self._stages = tuple(stages)
        self._rate = rate
        self._concurrency = concurrency
        self._failure_every = failure_every
        self._retry_every = retry_every
        self._random = random.Random(seed)

    async def __call__(
        self,
        jobs: int,
        stop: asyncio.Event,
        *,
        job_prefix: str = "demo",
        on_event: Callable[[DemoTally], None] | None = None,
        on_job_started: Callable[[str], None] | None = None,
    ) -> DemoTally:
        tally = DemoTally()
        pacer = _Pacer(self._rate)
        queue: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()
        run_id = f"{job_prefix}-{int(time.time() * 1000):x}-{self._random.randrange(16**4):04x}"
        for number in range(jobs):
            chat = self._chat_publisher is not None and number % 2 == 1
            queue.put_nowait((f"{run_id}-{number:04d}", chat))

        async def worker() -> None:
            while not stop.is_set():
                try:
                    job_id, chat = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                failing = self._random.randrange(self._failure_every) == 0
                if on_job_started is not None:
                    on_job_started(job_id)
                if chat:
                    await self._run_chat(job_id, pacer, tally, stop, on_event, fail=failing)
                    continue
                failing_at = self._random.randrange(len(self._stages)) if failing else None
                await self._run_job(job_id, pacer, tally, stop, on_event, failing_at)

        async with asyncio.TaskGroup() as group:
            for _ in range(min(self._concurrency, jobs)):
                group.create_task(worker())
        return tally

    @property
    def runs_chat(self) -> bool:
        """Whether chat jobs can be run (a chat publisher was given)."""
        return self._chat_publisher is not None

    async def run_one(
        self,
        job_id: str,
        stop: asyncio.Event,
        *,
        fail_at: int | None = None,
        chat: bool = False,
        ask: bool = False,
    ) -> DemoTally:
        """One whole pipeline for `job_id`, failing at stage index `fail_at` if given; a chat
        job (failing halfway through its answer when `fail_at` is given) with `chat`, which
        asks its user first with `ask` and stops when cancelled (given `controls`)."""
        tally = DemoTally()
        pacer = _Pacer(self._rate)
        if chat:
            await self._run_chat(
                job_id, pacer, tally, stop, None, fail=fail_at is not None, ask=ask, alone=True
            )
        else:
            await self._run_job(job_id, pacer, tally, stop, None, fail_at)
        return tally

    async def _run_chat(
        self,
        job_id: str,
        pacer: _Pacer,
        tally: DemoTally,
        stop: asyncio.Event,
        on_event: Callable[[DemoTally], None] | None,
        *,
        fail: bool,
        ask: bool = False,
        alone: bool = False,
    ) -> None:
        publisher = self._chat_publisher
        if publisher is None:
            raise ValueError("chat jobs need a chat publisher")
        controls = self._controls if alone else None
        tally.jobs_started += 1
        text = self._random.choice(CHAT_ANSWERS)

        async def stage(name: str, status: Status, **extra: Any) -> bool:
            if stop.is_set():
                return False
            await pacer.wait()
            seq = CHAT_PLAN.seq_for(name, status)
            await publisher.publish(StageEvent(job_id, name, status.value, seq=seq, **extra))
            tally.events += 1
            if on_event is not None:
                on_event(tally)
            return True

        async def cancelled() -> bool:
            if controls is None or not await controls.cancelled(job_id):
                return False
            # What it was sent is handled: acknowledged, then the end.
            async for message in controls.messages(job_id, timeout_s=0):
                await controls.acknowledge(message)
            await stage("done", Status.CANCELLED, result={"answer_chars": len("".join(typed))})
            return True

        opening = [
            ("queued", Status.QUEUED, {"progress": 0}),
            ("intent", Status.STARTED, {"progress": 5}),
            ("intent", Status.COMPLETED, {"progress": 10}),
        ]
        for name, status, extra in opening:
            if not await stage(name, status, **extra):
                return
        typed: list[str] = []
        if controls is not None and ask:
            question = {"message": CHAT_QUESTION, "input_type": "choice",
                        "options": list(CHAT_OPTIONS), "timeout": ASK_TIMEOUT_S}  # fmt: skip
            if not await stage("needs_input", Status.WAITING, result=question):
                return
            reply = await controls.next(job_id, timeout_s=ASK_TIMEOUT_S)
            if reply is not None and reply.body.get("input") in CHAT_OPTIONS:
                text = CHAT_ANSWERS[CHAT_OPTIONS.index(reply.body["input"])]
            if reply is not None and reply.kind is ControlKind.INPUT:
                await controls.acknowledge(reply)
            if await cancelled():
                return
        deltas = answer_tokens(text)
        if fail:
            deltas = deltas[: len(deltas) // 2]
        if not await stage("answer", Status.STARTED, progress=15):
            return
        published = await publisher.publish_tokens(
            job_id, self._typed(deltas, stop, typed, job_id, controls), node=CHAT_NODE
        )
        tally.tokens += published.entries
        if await cancelled():
            return
        if fail:
            error = {"error": "the model stopped mid-answer"}
            if await stage("answer", Status.FAILED, result=error):
                tally.jobs_failed += 1
            return
        if not await stage("answer", Status.COMPLETED, progress=95):
            return
        if await stage("done", Status.DONE, progress=100, result={"answer_chars": len(text)}):
            tally.jobs_finished += 1

    async def _typed(
        self,
        deltas: Sequence[str],
        stop: asyncio.Event,
        typed: list[str],
        job_id: str,
        controls: ControlInbox | None,
    ) -> AsyncIterator[str]:
        """`deltas` one by one at the demo's typing pace (each kept in `typed`), until `stop`
        is set or, given `controls`, a viewer cancels the job."""
        for delta in deltas:
            if stop.is_set() or (controls is not None and await controls.cancelled(job_id)):
                return
            typed.append(delta)
            yield delta
            await asyncio.sleep(self._token_interval_s)

    async def _run_job(
        self,
        job_id: str,
        pacer: _Pacer,
        tally: DemoTally,
        stop: asyncio.Event,
        on_event: Callable[[DemoTally], None] | None,
        failing_at: int | None,
    ) -> None:
        tally.jobs_started += 1
        plan: list[tuple[str, str, dict[str, Any]]] = [("queued", "queued", {"progress": 0})]
        for index, stage in enumerate(self._stages):
            share = 100 // (len(self._stages) + 1)
            plan.append((stage, "started", {"progress": index * share + share // 3}))
            if failing_at == index:
                plan.append((stage, "failed", {"result": {"error": f"{stage} timed out"}}))
                break
            plan.append((stage, "completed", {"progress": (index + 1) * share}))
        else:
            label = self._random.choice(LABELS)
            score = round(self._random.uniform(0.55, 0.99), 3)
            result = {"label": label, "score": score}
            plan.append(("done", "done", {"progress": 100, "result": result}))
        for stage, status, extra in plan:
            if stop.is_set():
                return
            await pacer.wait()
            event = StageEvent(job_id, stage, status, **extra)
            await self._publisher.publish(event)
            tally.events += 1
            if self._random.randrange(self._retry_every) == 0:
                await self._publisher.publish(event)
                tally.retries += 1
            if on_event is not None:
                on_event(tally)
        if failing_at is None:
            tally.jobs_finished += 1
        else:
            tally.jobs_failed += 1


class StartDemoJob:
    """Start one simulated job in the background and return its id at once.

    - Job ids are unique per call; the job runs at the demo's pace until done or failed.
    - Every job is owned: `aclose()` stops and awaits them all (application shutdown).
    """

    def __init__(self, *, run: RunDemoJobs, job_prefix: str = "demo") -> None:
        self._run = run
        self._prefix = job_prefix
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[DemoTally]] = set()
        self._count = 0

    async def __call__(self, *, fail: bool = False, chat: bool = False, ask: bool = False) -> str:
        """A job's id; a chat job with `chat` (refused with ValueError when the run has no
        chat publisher), which asks its user first and may be cancelled with `ask`."""
        if chat and not self._run.runs_chat:
            raise ValueError("chat jobs need a chat publisher")
        self._count += 1
        job_id = f"{self._prefix}-{int(time.time() * 1000):x}-{self._count}"
        run = self._run.run_one(job_id, self._stop, fail_at=2 if fail else None, chat=chat, ask=ask)
        task = asyncio.create_task(run, name=job_id)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job_id

    async def aclose(self) -> None:
        self._stop.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
