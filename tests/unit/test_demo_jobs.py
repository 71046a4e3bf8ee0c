"""RunDemoJobs on an in-memory publisher: whole pipelines, retries absorbed, early stop."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from eco_router.application.demo_jobs import DemoTally, RunDemoJobs
from eco_router.application.ports import ProgressPublisher
from eco_router.domain.progress import StageEvent, StagePlan, Status

STAGES = ("vision", "rule", "answer", "reward")
PLAN = StagePlan(STAGES)
FAST = 1_000_000.0  # events per second: the pacer never holds a test back


@dataclass(frozen=True, slots=True)
class Published:
    """One call as the fake received it."""

    job_id: str
    stage: str
    status: str
    result: str
    progress: int | None
    seq: int | None


@dataclass
class FakeProgressPublisher(ProgressPublisher):
    """Keeps every call and, like the Redis one, appends (job, stage, status) only once."""

    calls: list[Published] = field(default_factory=list)
    entries: dict[tuple[str, str, str], str] = field(default_factory=dict)
    appended: list[Published] = field(default_factory=list)

    async def publish(self, event: StageEvent) -> str:
        call = Published(
            event.job_id,
            event.stage,
            event.status,
            orjson.dumps(event.result).decode(),
            event.progress,
            event.seq,
        )
        self.calls.append(call)
        key = (event.job_id, event.stage, event.status)
        if key not in self.entries:
            self.entries[key] = f"1-{len(self.entries)}"
            self.appended.append(call)
        return self.entries[key]

    def by_job(self) -> dict[str, list[Published]]:
        """The appended events of each job, in append order."""
        jobs: dict[str, list[Published]] = defaultdict(list)
        for event in self.appended:
            jobs[event.job_id].append(event)
        return dict(jobs)


def run_demo(publisher: FakeProgressPublisher, **overrides: Any) -> RunDemoJobs:
    values: dict[str, Any] = {"publisher": publisher, "stages": STAGES, "rate": FAST}
    values.update(overrides)
    return RunDemoJobs(**values)


def seq_of(event: Published) -> int:
    return PLAN.seq_for(event.stage, Status(event.status))


class TestWholePipelines:
    async def test_every_job_ends_with_done_or_failed(self) -> None:
        publisher = FakeProgressPublisher()
        tally = await run_demo(publisher, failure_every=3, seed=1)(30, asyncio.Event())

        jobs = publisher.by_job()
        assert len(jobs) == 30
        assert {events[-1].status for events in jobs.values()} == {"done", "failed"}
        failed = sum(events[-1].status == "failed" for events in jobs.values())
        assert (tally.jobs_finished, tally.jobs_failed) == (30 - failed, failed)

    async def test_each_job_starts_queued_and_its_seqs_strictly_increase(self) -> None:
        publisher = FakeProgressPublisher()
        await run_demo(publisher, failure_every=3, seed=2)(30, asyncio.Event())

        for job_id, events in publisher.by_job().items():
            seqs = [seq_of(event) for event in events]
            assert seqs[0] == 0, job_id
            assert all(a < b for a, b in itertools.pairwise(seqs)), (job_id, seqs)

    async def test_a_finished_job_runs_every_stage_and_ends_with_a_result(self) -> None:
        publisher = FakeProgressPublisher()
        await run_demo(publisher, failure_every=10**9, seed=3)(5, asyncio.Event())

        for events in publisher.by_job().values():
            assert [(e.stage, e.status) for e in events] == [
                ("queued", "queued"),
                *((stage, status) for stage in STAGES for status in ("started", "completed")),
                ("done", "done"),
            ]
            assert events[-1].progress == 100
            assert set(orjson.loads(events[-1].result)) == {"label", "score"}

    async def test_a_failed_job_stops_at_the_failed_stage_with_an_error(self) -> None:
        publisher = FakeProgressPublisher()
        await run_demo(publisher, failure_every=1, seed=4)(5, asyncio.Event())

        for events in publisher.by_job().values():
            last = events[-1]
            assert (last.status, events[-2].status, events[-2].stage) == (
                "failed",
                "started",
                last.stage,
            )
            assert orjson.loads(last.result) == {"error": f"{last.stage} timed out"}


class TestRetries:
    async def test_retries_repeat_the_same_call_and_append_nothing_new(self) -> None:
        publisher = FakeProgressPublisher()
        tally = await run_demo(publisher, retry_every=2, seed=5)(20, asyncio.Event())

        assert tally.retries > 0
        assert len(publisher.calls) == tally.events + tally.retries
        assert len(publisher.appended) == tally.events
        assert set(publisher.calls) == set(publisher.appended)

    async def test_no_job_has_the_same_event_twice(self) -> None:
        publisher = FakeProgressPublisher()
        await run_demo(publisher, retry_every=2, seed=6)(20, asyncio.Event())

        for job_id, events in publisher.by_job().items():
            keys = [(e.stage, e.status) for e in events]
            assert len(keys) == len(set(keys)), job_id

    async def test_the_job_ids_are_distinct_and_carry_the_prefix(self) -> None:
        publisher = FakeProgressPublisher()
        await run_demo(publisher)(12, asyncio.Event(), job_prefix="smoke")

        jobs = publisher.by_job()
        assert len(jobs) == 12
        assert all(job.startswith("smoke-") for job in jobs)


class TestStopping:
    async def test_a_set_stop_event_ends_the_run_early(self) -> None:
        publisher = FakeProgressPublisher()
        stop = asyncio.Event()

        def stop_after_five(tally: DemoTally) -> None:
            if tally.events >= 5:
                stop.set()

        run = run_demo(publisher, concurrency=1, retry_every=10**9, seed=7)
        tally = await run(50, stop, on_event=stop_after_five)

        assert tally.events == 5
        assert len(publisher.appended) == 5
        assert tally.jobs_finished + tally.jobs_failed < 50

    async def test_a_stop_set_before_the_start_publishes_nothing(self) -> None:
        publisher = FakeProgressPublisher()
        stop = asyncio.Event()
        stop.set()

        tally = await run_demo(publisher)(10, stop)

        assert publisher.calls == []
        assert tally.jobs_started == 0

    async def test_on_event_sees_the_tally_after_every_published_event(self) -> None:
        publisher = FakeProgressPublisher()
        seen: list[int] = []

        tally = await run_demo(publisher, seed=8)(
            4, asyncio.Event(), on_event=lambda t: seen.append(t.events)
        )

        assert seen == list(range(1, tally.events + 1))
