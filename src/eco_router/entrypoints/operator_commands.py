"""The operator subcommands: publish, demo, state and dlq."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, TextIO

import orjson
from redis.asyncio import Redis

from eco_router.adapters.progress_entries import ProducerConfig
from eco_router.adapters.redis.connection import open_redis, redacted
from eco_router.adapters.redis.dead_letters import RedisDeadLetterArchive
from eco_router.adapters.redis.errors import TRANSIENT_REDIS_ERRORS
from eco_router.adapters.redis.publisher import AsyncStreamPublisher
from eco_router.adapters.redis.state_store import RedisLuaStateStore
from eco_router.application.demo_jobs import DemoTally, RunDemoJobs
from eco_router.application.errors import TransientError
from eco_router.domain.progress import StagePlan
from eco_router.domain.streams import StreamFamily
from eco_router.entrypoints.settings import Settings


class UsageError(Exception):
    """A command-line argument the command cannot use; the message says why."""


def family_for(settings: Settings, domain: str) -> StreamFamily:
    """The configured family whose domain is `domain`."""
    for family in settings.streams:
        if family.domain == domain:
            return family
    known = ", ".join(f.domain for f in settings.streams)
    raise UsageError(f"unknown domain {domain!r}; EVENT_ROUTER_STREAMS configures: {known}")


def producer_config(settings: Settings, domain: str, stages: str | None) -> ProducerConfig:
    plan = StagePlan(tuple(s.strip() for s in stages.split(","))) if stages else StagePlan()
    return ProducerConfig(family=family_for(settings, domain), plan=plan)


@asynccontextmanager
async def streams_client(settings: Settings) -> AsyncIterator[Redis]:
    """A client of the streams server that answered PING; one clear error when it cannot."""
    url = settings.redis_streams_url
    async with open_redis(
        url, socket_timeout_s=10.0, client_name="eco-router-cli", ping=False
    ) as client:
        try:
            await client.ping()
        except TRANSIENT_REDIS_ERRORS as error:
            where = f"{redacted(url)} (REDIS_STREAMS_URL)"
            raise TransientError(
                f"cannot connect to the streams server at {where}: {error}"
            ) from error
        yield client


async def publish(
    settings: Settings,
    *,
    domain: str,
    job: str,
    stage: str,
    status: str,
    result: str | None,
    progress: int | None,
    seq: int | None,
    stages: str | None,
    out: TextIO,
) -> int:
    config = producer_config(settings, domain, stages)
    decoded: Any = None
    if result is not None:
        try:
            decoded = json.loads(result)
        except ValueError as error:
            raise UsageError(f"--result is not JSON: {error}") from error
    # Validate before connecting: bad input never reaches Redis.
    config.call(job, stage, status, result=decoded, progress=progress, seq=seq)
    async with streams_client(settings) as client:
        publisher = AsyncStreamPublisher(client, config)
        entry_id = await publisher.publish_stage_event(
            job, stage, status, result=decoded, progress=progress, seq=seq
        )
    print(f"{config.family.stream_for(job)} {entry_id}", file=out)
    return 0


async def demo(
    settings: Settings,
    *,
    domain: str,
    jobs: int,
    rate: float,
    stages: str | None,
    out: TextIO,
) -> int:
    config = producer_config(settings, domain, stages)
    stop = _stop_on_signals()
    live = _LiveLine(out)
    async with streams_client(settings) as client:
        run = RunDemoJobs(
            publisher=AsyncStreamPublisher(client, config), stages=config.plan.stages, rate=rate
        )
        tally = await run(jobs, stop, on_event=lambda t: live.show(_describe(t, jobs)))
    live.finish(_describe(tally, jobs) + (" (stopped)" if stop.is_set() else ""))
    return 0


async def state(settings: Settings, *, domain: str, job: str, as_json: bool, out: TextIO) -> int:
    family_for(settings, domain)
    async with streams_client(settings) as client:
        store = RedisLuaStateStore(
            client,
            group=settings.consumer_group,
            state_ttl_s=settings.state_ttl_s,
            markers_ttl_s=settings.published_ttl_s,
            history_size=settings.history_size,
        )
        view = await store.view(domain, job)
    snapshot = orjson.loads(view.state) if view.state else None
    history = [orjson.loads(p) for p in view.history]
    if as_json:
        print(json.dumps({"state": snapshot, "history": history}, ensure_ascii=False), file=out)
        return 0 if snapshot is not None else 1
    if snapshot is None:
        print(f"no state for {domain} job {job!r} (unknown or expired)", file=out)
        return 1
    print(f"{domain} job {job}: {_line(snapshot)}", file=out)
    print(f"history ({len(history)} events):", file=out)
    for event in history:
        print(f"  {_line(event)}", file=out)
    return 0


async def dlq_list(settings: Settings, *, domain: str, count: int, out: TextIO) -> int:
    family = family_for(settings, domain)
    async with streams_client(settings) as client:
        letters = await RedisDeadLetterArchive(client).oldest(family, count=count)
    if not letters:
        print(f"{family.dead_letter_stream} is empty", file=out)
    for letter in letters:
        fields = " ".join(
            f"{k.decode(errors='replace')}={_short(v)}" for k, v in letter.fields.items()
        )
        print(
            f"{letter.dlq_id}  {letter.reason:<22} {letter.stream} {letter.entry_id} "
            f"deliveries={letter.deliveries}  {letter.detail}\n    {fields}",
            file=out,
        )
    return 0


async def dlq_replay(
    settings: Settings, *, domain: str, ids: list[str], replay_all: bool, out: TextIO
) -> int:
    if replay_all == bool(ids):
        raise UsageError("give dead-letter ids or --all, not both and not neither")
    family = family_for(settings, domain)
    async with streams_client(settings) as client:
        try:
            replayed = await RedisDeadLetterArchive(client).replay(
                family, None if replay_all else ids
            )
        except (LookupError, ValueError) as error:
            raise UsageError(str(error)) from error
    for item in replayed:
        print(f"{item.dlq_id} -> {item.stream} {item.new_id}", file=out)
    print(f"replayed {len(replayed)} dead letters", file=out)
    return 0


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def _describe(tally: DemoTally, jobs: int) -> str:
    done = tally.jobs_finished + tally.jobs_failed
    return (
        f"jobs {done}/{jobs} ({tally.jobs_failed} failed) · events {tally.events} "
        f"(+{tally.retries} retried) · {tally.rate:.0f} ev/s"
    )


class _LiveLine:
    """One status line rewritten in place on a terminal, printed now and then otherwise."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._count = 0

    def show(self, text: str) -> None:
        self._count += 1
        if self._tty:
            print(f"\r{text}\033[K", end="", file=self._out, flush=True)
        elif self._count % 100 == 0:
            print(text, file=self._out, flush=True)

    def finish(self, text: str) -> None:
        print(f"\r{text}\033[K" if self._tty else text, file=self._out, flush=True)


def _line(event: dict[str, Any]) -> str:
    parts = [f"seq={event.get('seq')}", f"{event.get('stage')}/{event.get('status')}"]
    if event.get("progress") is not None:
        parts.append(f"{event['progress']}%")
    if "result" in event:
        parts.append(f"result={json.dumps(event['result'], ensure_ascii=False)}")
    return "  ".join(parts)


def _short(value: bytes, limit: int = 60) -> str:
    text = value.decode(errors="replace")
    return text if len(text) <= limit else f"{text[:limit]}… ({len(value)} bytes)"
