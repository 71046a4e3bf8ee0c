"""Helpers for end-to-end tests: worker subprocesses, a Pub/Sub collector, polling."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, cast, overload

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from eco_router.domain.streams import StreamFamily

T = TypeVar("T")

SCAN = StreamFamily("scan:events", 4)
CHAT = StreamFamily("chat:events", 2)
FAMILIES = (SCAN, CHAT)
FAMILIES_SPEC = ",".join(f"{f.prefix}={f.shards}" for f in FAMILIES)
GROUP = "eventrouter"
CHANNEL_PREFIX = "sse:events"
ALL_STREAMS = tuple(s for f in FAMILIES for s in f.streams)

_READY_LINE = re.compile(r"health and metrics on (http://[0-9.]+:[0-9]+)")
_names = itertools.count(1)


# --- waiting ---------------------------------------------------------------------------------


@overload
async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = ...,
    every_s: float = ...,
    what: str = ...,
) -> T: ...
@overload
async def eventually(
    probe: Callable[[], T], *, timeout_s: float = ..., every_s: float = ..., what: str = ...
) -> T: ...
async def eventually(
    probe: Callable[[], Any],
    *,
    timeout_s: float = 15.0,
    every_s: float = 0.05,
    what: str = "condition",
) -> T:
    """The first truthy value of `probe` (sync or async); AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return cast(T, value)
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s (last value {value!r})")
        await asyncio.sleep(every_s)


# --- streams ---------------------------------------------------------------------------------


def job_in_shard(family: StreamFamily, shard: int, stem: str) -> str:
    """A job id starting with `stem` that the shard rule puts on `shard` of `family`."""
    for n in itertools.count():
        job_id = f"{stem}-{n}"
        if family.stream_for(job_id) == f"{family.prefix}:{shard}":
            return job_id
    raise AssertionError("unreachable")


async def add_event(
    redis: Redis, job_id: str, seq: int | str, *, family: StreamFamily = SCAN, **fields: str
) -> str:
    """XADD one event to the job's shard the way producers do; returns the entry id."""
    entry: dict[str, str] = {"job_id": job_id, "seq": str(seq), **fields}
    entry_id = await redis.xadd(family.stream_for(job_id), entry)  # type: ignore[arg-type]
    return str(entry_id.decode())


async def add_raw(redis: Redis, stream: str, fields: Mapping[bytes, bytes]) -> str:
    """XADD fields byte for byte (for entries producers should never write)."""
    entry_id = await redis.xadd(stream, dict(fields))  # type: ignore[arg-type]
    return str(entry_id.decode())


async def pending_count(redis: Redis, streams: tuple[str, ...] = ALL_STREAMS) -> int:
    """Entries delivered to the group and not acked, over `streams` (a missing group counts 0)."""
    total = 0
    for stream in streams:
        try:
            summary = await redis.xpending(stream, GROUP)
        except ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            continue
        total += int(summary["pending"])
    return total


async def pending_by_consumer(
    redis: Redis, streams: tuple[str, ...] = ALL_STREAMS
) -> dict[str, int]:
    """Pending entry counts per consumer name, over `streams`."""
    counts: dict[str, int] = {}
    for stream in streams:
        try:
            summary = await redis.xpending(stream, GROUP)
        except ResponseError:
            continue
        for consumer in summary["consumers"] or []:
            name = consumer["name"].decode()
            counts[name] = counts.get(name, 0) + int(consumer["pending"])
    return counts


async def dead_letters(redis: Redis, family: StreamFamily = SCAN) -> list[dict[bytes, bytes]]:
    """Every entry of the family's dead-letter stream, oldest first."""
    return [fields for _, fields in await redis.xrange(family.dead_letter_stream)]


async def job_state(redis: Redis, job_id: str, domain: str = "scan") -> dict[str, Any] | None:
    """The job's state snapshot as the router stored it, decoded."""
    raw = await redis.get(f"{domain}:state:{job_id}")
    return None if raw is None else dict(orjson.loads(raw))


# --- metrics ---------------------------------------------------------------------------------


def metric_value(exposition: str, sample: str, **labels: str) -> float:
    """The sum of the samples named `sample` whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for item in family.samples:
            if item.name == sample and labels.items() <= item.labels.items():
                total += item.value
    return total


# --- the worker process ----------------------------------------------------------------------


def worker_env(streams_url: str, pubsub_url: str, **overrides: str) -> dict[str, str]:
    """The environment of a worker: the servers, quick reads, a free HTTP port; `overrides` win."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVENT_ROUTER_", "REDIS_")) and k != "POD_NAME"
    }
    env.update(
        REDIS_STREAMS_URL=streams_url,
        REDIS_PUBSUB_URL=pubsub_url,
        EVENT_ROUTER_STREAMS=FAMILIES_SPEC,
        EVENT_ROUTER_CONSUMER_GROUP=GROUP,
        EVENT_ROUTER_CHANNEL_PREFIX=CHANNEL_PREFIX,
        EVENT_ROUTER_HTTP_HOST="127.0.0.1",
        EVENT_ROUTER_HTTP_PORT="0",
        EVENT_ROUTER_READ_BLOCK_MS="500",
        EVENT_ROUTER_STATS_INTERVAL_S="0.5",
        EVENT_ROUTER_LOG_LEVEL="INFO",
    )
    env.update(overrides)
    return env


class WorkerProcess:
    """One `eco-router worker` child process, its stderr log file and its HTTP address."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path, name: str) -> None:
        self.process = process
        self.log_path = log_path
        self.name = name
        self.base_url = ""

    @staticmethod
    def command() -> list[str]:
        """The `eco-router` console script of this interpreter's environment."""
        script = Path(sys.executable).with_name("eco-router")
        if script.exists():
            return [str(script)]
        return [sys.executable, "-m", "eco_router.entrypoints.cli"]

    @classmethod
    def spawn(cls, env: Mapping[str, str], log_path: Path, *, command: str = "worker") -> Self:
        """Start the process without waiting for it."""
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*cls.command(), command],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return cls(process, log_path, env.get("EVENT_ROUTER_CONSUMER_NAME", "worker"))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return f"--- {self.log_path} ---\n" + "\n".join(self.log().splitlines()[-lines:])

    @property
    def exit_code(self) -> int | None:
        return self.process.poll()

    async def until_ready(self, timeout_s: float = 15.0) -> Self:
        """Wait for the "health and metrics on http://..." line; fail if the process ends first."""

        def address() -> str | None:
            found = _READY_LINE.search(self.log())
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                raise AssertionError(
                    f"worker exited with {self.process.returncode} before it was ready\n"
                    + self.log_tail()
                )
            return None

        try:
            self.base_url = await eventually(address, timeout_s=timeout_s, what="worker ready")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.log_tail()}") from None
        return self

    async def get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=10.0, trust_env=False) as c:
            return await c.get(path)

    async def metric(self, sample: str, **labels: str) -> float:
        """A sample of this worker's /metrics, summed over labels not given."""
        response = await self.get("/metrics")
        response.raise_for_status()
        return metric_value(response.text, sample, **labels)

    async def metric_reaching(self, sample: str, minimum: float, **labels: str) -> float:
        """The sample once it is at least `minimum` (metrics are updated after the acks)."""

        async def probe() -> float | None:
            value = await self.metric(sample, **labels)
            return value if value >= minimum else None

        found = await eventually(probe, what=f"{sample} reaching {minimum}")
        assert found is not None
        return found

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, as a crashed pod: no drain, no ack."""
        self.process.kill()
        self.process.wait()

    async def wait_exit(self, timeout_s: float = 15.0) -> int:
        """The exit code, once the process has ended within `timeout_s`."""
        try:
            await eventually(
                lambda: self.process.poll() is not None, timeout_s=timeout_s, what="worker exit"
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.log_tail()}") from None
        return self.process.returncode

    def ensure_dead(self) -> None:
        if self.process.poll() is None:
            self.kill()


class Workers:
    """Starts workers against a pair of servers and kills whatever is left at teardown."""

    def __init__(self, log_dir: Path, *, streams_url: str, pubsub_url: str) -> None:
        self._log_dir = log_dir
        self.streams_url = streams_url
        self.pubsub_url = pubsub_url
        self.started: list[WorkerProcess] = []

    def spawn(
        self,
        *,
        streams_url: str | None = None,
        pubsub_url: str | None = None,
        command: str = "worker",
        **env: str,
    ) -> WorkerProcess:
        name = env.setdefault("EVENT_ROUTER_CONSUMER_NAME", f"worker-{next(_names)}")
        worker = WorkerProcess.spawn(
            worker_env(streams_url or self.streams_url, pubsub_url or self.pubsub_url, **env),
            self._log_dir / f"{name}.log",
            command=command,
        )
        self.started.append(worker)
        return worker

    async def start(
        self, *, streams_url: str | None = None, pubsub_url: str | None = None, **env: str
    ) -> WorkerProcess:
        """A worker that has logged its HTTP address."""
        worker = self.spawn(streams_url=streams_url, pubsub_url=pubsub_url, **env)
        return await worker.until_ready()

    def kill_all(self) -> None:
        for worker in self.started:
            worker.ensure_dead()


# --- Pub/Sub ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """One message a subscriber got."""

    channel: str
    payload: dict[str, Any]


class PubSubCollector:
    """PSUBSCRIBEs `sse:events:*` in a background task and keeps every message.

    A lost connection (the server stopped or restarted) is retried every few milliseconds;
    `subscriptions` counts confirmed subscriptions, so a test can wait for the one after a restart.
    """

    def __init__(self, url: str, pattern: str = f"{CHANNEL_PREFIX}:*") -> None:
        self._url = url
        self._pattern = pattern
        self.messages: list[Received] = []
        self.subscriptions = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name="pubsub-collector")
        await self.until_subscribed(1)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def until_subscribed(self, count: int) -> None:
        await eventually(
            lambda: self.subscriptions >= count, what=f"subscription #{count} confirmed"
        )

    def for_job(self, job_id: str) -> list[dict[str, Any]]:
        """Payloads received on the job's channel, in arrival order."""
        channel = f"{CHANNEL_PREFIX}:{job_id}"
        return [m.payload for m in self.messages if m.channel == channel]

    def seqs(self, job_id: str) -> list[int]:
        return [int(p["seq"]) for p in self.for_job(job_id)]

    def received_keys(self) -> set[tuple[str, int]]:
        return {(m.payload["job_id"], int(m.payload["seq"])) for m in self.messages}

    def stream_ids(self) -> set[str]:
        return {str(m.payload["stream_id"]) for m in self.messages}

    async def _run(self) -> None:
        while True:
            client = Redis.from_url(
                self._url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1.0
            )
            pubsub = client.pubsub()
            try:
                await pubsub.psubscribe(self._pattern)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._keep(message)
            except (RedisError, OSError):
                await asyncio.sleep(0.005)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()

    def _keep(self, message: dict[str, Any]) -> None:
        if message["type"] == "psubscribe":
            self.subscriptions += 1
        elif message["type"] == "pmessage":
            channel = message["channel"]
            self.messages.append(
                Received(
                    channel.decode() if isinstance(channel, bytes) else channel,
                    orjson.loads(message["data"]),
                )
            )


async def eco_router(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `eco-router ARGS` to completion (off the event loop) and keep its output."""
    return await asyncio.to_thread(
        subprocess.run,
        [*WorkerProcess.command(), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
