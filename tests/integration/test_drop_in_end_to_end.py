"""Producers on the reference design, end to end: their call sites (through
`publish_stage_event` on their own client) and their raw entries (every field a string, empty
when absent, trace fields), through a worker process and a gateway process
(`serve --no-router`) to an SSE client, in order, retries deduplicated."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import format_span_id, format_trace_id
from redis.asyncio import Redis

from eco_router.producer import publish_stage_event
from eco_router.testing import RedisServer
from tests.integration.sse_client import SseEvent, SseStream, open_sse, sse_client
from tests.integration.support import SCAN, Workers
from tests.integration.test_gateway import Gateway, Gateways, events_path

RESULT = {"answer": "정상입니다", "category": "플라스틱", "disposal": "라벨을 떼고 분리배출"}
STAGES = ("vision", "rule", "answer", "reward")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# The reference design's seq rule: stage order ·10, +1 when completed (`failed` gets +0).
REFERENCE_ORDER = {"queued": 0, "vision": 1, "rule": 2, "answer": 3, "reward": 4, "done": 5}


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    launcher = Gateways(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
async def gateway(
    workers: Workers,
    gateways: Gateways,
    streams_server: RedisServer,
    pubsub_server: RedisServer,
) -> Gateway:
    """A worker and a gateway without a router of its own, as deployed."""
    await workers.start()
    return await asyncio.to_thread(
        lambda: gateways.start(
            streams_url=streams_server.url, pubsub_url=pubsub_server.url, no_router=True
        )
    )


@pytest.fixture
def worker_client(streams_server: RedisServer) -> Iterator[redis.Redis]:
    """The synchronous client a Celery worker of the reference design holds."""
    client = redis.Redis.from_url(streams_server.url, decode_responses=True)
    yield client
    client.close()


def new_job() -> str:
    return str(uuid.uuid4())


def names_and_ids(events: list[SseEvent]) -> list[tuple[str, str | None]]:
    return [(e.event, e.id) for e in events]


async def opened(stream: SseStream) -> None:
    """The job is unknown yet: the stream starts with a snapshot of no state."""
    [snapshot] = await stream.read(1)
    assert snapshot.event == "snapshot"
    assert snapshot.json()["state"] is None


def reference_pipeline(client: redis.Redis, job_id: str) -> None:
    """The reference design's call sites, in its order, with a Celery retry's repeats."""
    publish_stage_event(client, job_id, "queued", "started", progress=0)
    for number, stage in enumerate(STAGES):
        publish_stage_event(client, job_id, stage, "started", progress=number * 25)
        publish_stage_event(client, job_id, stage, "started", progress=number * 25)
        publish_stage_event(client, job_id, stage, "completed", progress=(number + 1) * 25)
    publish_stage_event(client, job_id, "done", "completed", result=RESULT)
    publish_stage_event(client, job_id, "done", "completed", result=RESULT)


class TestReferenceCallSites:
    async def test_every_stage_reaches_the_browser_once_in_order(
        self, gateway: Gateway, worker_client: redis.Redis
    ) -> None:
        job = new_job()
        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as stream:
            await opened(stream)
            await asyncio.to_thread(reference_pipeline, worker_client, job)
            events = await stream.read_to_end()

        assert names_and_ids(events) == [
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
        queued, *_, done = [e.json() for e in events]
        assert (queued["stage"], queued["status"], queued["progress"]) == ("queued", "started", 0)
        assert [e.json().get("progress") for e in events[1:-1]] == [0, 25, 25, 50, 50, 75, 75, 100]
        assert (done["stage"], done["status"], done["result"]) == ("done", "completed", RESULT)
        assert "정상입니다" in events[-1].data
        assert not {"traceparent", "trace_id", "span_id"} & {k for e in events for k in e.json()}

    async def test_a_failed_stage_ends_the_stream_with_an_error_event(
        self, gateway: Gateway, worker_client: redis.Redis
    ) -> None:
        job = new_job()

        def failing() -> None:
            publish_stage_event(worker_client, job, "queued", "started", progress=0)
            publish_stage_event(worker_client, job, "vision", "started", progress=0)
            publish_stage_event(
                worker_client, job, "vision", "failed", result={"error": "이미지를 읽을 수 없음"}
            )

        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as stream:
            await opened(stream)
            await asyncio.to_thread(failing)
            events = await stream.read_to_end()

        assert names_and_ids(events) == [("queued", "0"), ("vision", "10"), ("error", "12")]
        assert events[-1].json()["result"] == {"error": "이미지를 읽을 수 없음"}

    async def test_the_trace_context_of_the_call_reaches_the_browser(
        self, gateway: Gateway, worker_client: redis.Redis
    ) -> None:
        job = new_job()
        tracer = TracerProvider().get_tracer("scan-worker")

        def traced() -> str:
            with tracer.start_as_current_span("scan.reward") as span:
                publish_stage_event(worker_client, job, "done", "completed", result=RESULT)
            context = span.get_span_context()
            return f"{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}"

        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as stream:
            await opened(stream)
            ids = await asyncio.to_thread(traced)
            [done] = await stream.read_to_end()

        assert done.event == "done"
        assert done.json()["traceparent"].startswith(f"00-{ids}-")


def reference_entry(
    job_id: str,
    stage: str,
    status: str,
    *,
    progress: int | None = None,
    result: dict[str, Any] | None = None,
    traceparent: str = "",
    trace_id: str = "",
    span_id: str = "",
) -> dict[str, str]:
    """An entry exactly as the reference producer's script writes it."""
    seq = REFERENCE_ORDER[stage] * 10 + (1 if status == "completed" else 0)
    return {
        "job_id": job_id,
        "stage": stage,
        "status": status,
        "seq": str(seq),
        "ts": str(time.time()),
        "progress": "" if progress is None else str(progress),
        "result": json.dumps(result, ensure_ascii=False) if result else "",
        "trace_id": trace_id,
        "span_id": span_id,
        "traceparent": traceparent,
    }


class TestReferenceEntries:
    async def test_raw_entries_reach_the_browser_with_empty_fields_dropped(
        self, gateway: Gateway, streams_redis: Redis
    ) -> None:
        job = new_job()
        stream = SCAN.stream_for(job)
        entries = [
            reference_entry(job, "queued", "started", progress=0),
            reference_entry(
                job,
                "vision",
                "started",
                progress=0,
                traceparent=TRACEPARENT,
                trace_id=TRACEPARENT[3:35],
                span_id=TRACEPARENT[36:52],
            ),
            # A retry past the producer's window: the same seq again.
            reference_entry(job, "vision", "started", progress=0),
            reference_entry(job, "vision", "completed", progress=25, traceparent="garbage"),
            reference_entry(job, "done", "completed", result=RESULT, traceparent=TRACEPARENT),
        ]
        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as sse:
            await opened(sse)
            for fields in entries:
                await streams_redis.xadd(stream, fields)  # type: ignore[arg-type]
            events = await sse.read_to_end()

        assert names_and_ids(events) == [
            ("queued", "0"),
            ("vision", "10"),
            ("vision", "11"),
            ("done", "51"),
        ]
        queued, started, completed, done = (e.json() for e in events)
        assert queued["progress"] == 0
        assert not {"result", "trace_id", "span_id", "traceparent"} & set(queued)
        assert started["traceparent"] == TRACEPARENT
        assert (started["trace_id"], started["span_id"]) == (TRACEPARENT[3:35], TRACEPARENT[36:52])
        assert completed["progress"] == 25
        assert "traceparent" not in completed
        assert done["result"] == RESULT
        assert done["traceparent"] == TRACEPARENT
        assert "progress" not in done

    async def test_the_reference_failed_seq_is_deduplicated_away(
        self, gateway: Gateway, streams_redis: Redis
    ) -> None:
        """The reference producer's known defect: `failed` has the seq of `started`."""
        job = new_job()
        stream = SCAN.stream_for(job)
        failed = reference_entry(job, "vision", "failed", result={"error": "timeout"})
        assert failed["seq"] == "10"
        async with sse_client(gateway.base_url) as http, open_sse(http, events_path(job)) as sse:
            await opened(sse)
            for fields in (
                reference_entry(job, "queued", "started", progress=0),
                reference_entry(job, "vision", "started", progress=0),
                failed,
                reference_entry(job, "done", "completed", result=RESULT),
            ):
                await streams_redis.xadd(stream, fields)  # type: ignore[arg-type]
            events = await sse.read_to_end()

        assert names_and_ids(events) == [("queued", "0"), ("vision", "10"), ("done", "51")]
        assert events[1].json()["status"] == "started"
