"""Use case: simulate workers running whole pipelines, so people can watch the system move."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eco_router.application.ports import ProgressPublisher

LABELS = ("cat", "dog", "bicycle", "receipt", "invoice", "screenshot", "landscape")


@dataclass(slots=True)
class DemoTally:
    """What the simulation has done so far."""

    jobs_started: int = 0
    jobs_finished: int = 0
    jobs_failed: int = 0
    events: int = 0
    retries: int = 0
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
    - Stops early, without half-written events, when `stop` is set.
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
    ) -> None:
        self._publisher = publisher
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
        queue: asyncio.Queue[str] = asyncio.Queue()
        run_id = f"{job_prefix}-{int(time.time() * 1000):x}-{self._random.randrange(16**4):04x}"
        for number in range(jobs):
            queue.put_nowait(f"{run_id}-{number:04d}")

        async def worker() -> None:
            while not stop.is_set():
                try:
                    job_id = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                failing_at = (
                    self._random.randrange(len(self._stages))
                    if self._random.randrange(self._failure_every) == 0
                    else None
                )
                if on_job_started is not None:
                    on_job_started(job_id)
                await self._run_job(job_id, pacer, tally, stop, on_event, failing_at)

        async with asyncio.TaskGroup() as group:
            for _ in range(min(self._concurrency, jobs)):
                group.create_task(worker())
        return tally

    async def run_one(
        self, job_id: str, stop: asyncio.Event, *, fail_at: int | None = None
    ) -> DemoTally:
        """One whole pipeline for `job_id`, failing at stage index `fail_at` if given."""
        tally = DemoTally()
        await self._run_job(job_id, _Pacer(self._rate), tally, stop, None, fail_at)
        return tally

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
            await self._publisher.publish_stage_event(job_id, stage, status, **extra)
            tally.events += 1
            if self._random.randrange(self._retry_every) == 0:
                await self._publisher.publish_stage_event(job_id, stage, status, **extra)
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

    async def __call__(self, *, fail: bool = False) -> str:
        self._count += 1
        job_id = f"{self._prefix}-{int(time.time() * 1000):x}-{self._count}"
        run = self._run.run_one(job_id, self._stop, fail_at=2 if fail else None)
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
