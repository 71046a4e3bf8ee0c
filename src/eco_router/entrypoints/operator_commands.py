"""The operator subcommands: publish, demo, state, dlq and status."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from eco_router.application.ports import ProgressPublisher
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.progress import StageEvent, StagePlan
from eco_router.domain.streams import StreamFamily
from eco_router.domain.token_entries import DEFAULT_COALESCE_MS, TokensPublished
from eco_router.entrypoints.terminal_text import plural, printable

# The Redis adapters are imported by the commands that use them: each costs tens of
# milliseconds of start-up, which every command would otherwise pay for all of them.
if TYPE_CHECKING:
    from eco_router.adapters.progress_entries import ProducerConfig
    from eco_router.adapters.redis.connections.connection import RedisClient
    from eco_router.application.demo_jobs import DemoTally
    from eco_router.application.port_values import GroupView, ShardStats
    from eco_router.entrypoints.settings import Settings


class UsageError(Exception):
    """A command-line argument the command cannot use; the message says why."""


@dataclass(frozen=True, slots=True)
class Server:
    """The streams server a command talks to, as the operator is shown it."""

    url: str  # redacted: no password
    via: str  # why this one: the variable that names it, or the serve that runs it

    def line(self) -> str:
        return f"streams redis: {self.url} ({self.via})"

    def as_json(self) -> dict[str, str]:
        return {"url": self.url, "via": self.via}


def family_for(settings: Settings, domain: str) -> StreamFamily:
    """The configured family whose domain is `domain`."""
    for family in settings.streams:
        if family.domain == domain:
            return family
    known = ", ".join(f.domain for f in settings.streams)
    raise UsageError(f"unknown domain {domain!r}; EVENT_ROUTER_STREAMS configures: {known}")


def producer_config(settings: Settings, domain: str, stages: str | None) -> ProducerConfig:
    from eco_router.adapters.progress_entries import ProducerConfig

    plan = StagePlan(tuple(s.strip() for s in stages.split(","))) if stages else StagePlan()
    return ProducerConfig(
        family=family_for(settings, domain),
        plan=plan,
        size_limits=settings.event_size_limits,
        max_field_bytes=settings.max_field_bytes,
    )


@asynccontextmanager
async def streams_client(settings: Settings) -> AsyncIterator[RedisClient]:
    """A client of the streams server that answered PING; else the `StartupFailure` that
    `worker` and `serve` stop with (same line, same exit status)."""
    from redis.exceptions import RedisError

    from eco_router.adapters.redis.connections.connection import open_redis
    from eco_router.entrypoints.startup_checks import connection_failure

    url = settings.redis_streams_url
    async with open_redis(
        url, socket_timeout_s=10.0, client_name="eco-router-cli", ping=False
    ) as client:
        try:
            await client.ping()
        except (RedisError, OSError) as error:
            raise connection_failure("streams", url, error) from error
        yield client


async def publish(
    settings: Settings,
    server: Server,
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
    event = StageEvent(job, stage, status, result=decoded, progress=progress, seq=seq)
    # Validate before connecting: bad input never reaches Redis.
    config.stage_event(event)
    from eco_router.adapters.redis.producer.publisher import AsyncStreamPublisher

    async with streams_client(settings) as client:
        entry_id = await AsyncStreamPublisher(client, config).publish(event)
    say(server.line(), out)
    say(f"{config.family.stream_for(job)} {entry_id}", out)
    return 0


async def demo(
    settings: Settings,
    server: Server,
    *,
    domain: str,
    jobs: int,
    rate: float,
    stages: str | None,
    out: TextIO,
) -> int:
    from eco_router.adapters.redis.producer.publisher import AsyncStreamPublisher
    from eco_router.application.demo_jobs import RunDemoJobs

    config = producer_config(settings, domain, stages)
    stop = _stop_on_signals()
    live = _LiveLine(out)
    async with streams_client(settings) as client:
        live.note(server.line())
        publisher = _FailuresNoted(AsyncStreamPublisher(client, config))
        run = RunDemoJobs(publisher=publisher, stages=config.plan.stages, rate=rate)
        tally = await run(
            jobs,
            stop,
            on_event=lambda t: live.show(_describe(t, jobs)),
            on_job_started=lambda job: live.note(f"started {domain} job {job}"),
        )
    summary = _describe(tally, jobs, failed=publisher.failed_jobs)
    live.finish(summary + (" (stopped)" if stop.is_set() else ""))
    return 0


class _FailuresNoted(ProgressPublisher):
    """A publisher that notes which jobs it published a failure of, in order."""

    def __init__(self, publisher: ProgressPublisher) -> None:
        self._publisher = publisher
        self._failed: dict[str, None] = {}

    @property
    def failed_jobs(self) -> list[str]:
        return list(self._failed)

    async def publish(self, event: StageEvent) -> str:
        if event.status == "failed":
            self._failed[event.job_id] = None
        return await self._publisher.publish(event)

    async def publish_tokens(
        self,
        job_id: str,
        tokens: AsyncIterable[Any] | Iterable[Any],
        *,
        node: str | None = None,
        attempt: int = 0,
        coalesce_ms: float = DEFAULT_COALESCE_MS,
        first_seq: int = FIRST_TOKEN_SEQ,
    ) -> TokensPublished:
        return await self._publisher.publish_tokens(
            job_id, tokens, node=node, attempt=attempt, coalesce_ms=coalesce_ms, first_seq=first_seq
        )


async def state(
    settings: Settings, server: Server, *, domain: str, job: str, as_json: bool, out: TextIO
) -> int:
    import orjson

    from eco_router.adapters.redis.router.state_store import RedisLuaStateStore

    family_for(settings, domain)
    async with streams_client(settings) as client:
        store = RedisLuaStateStore(
            client,
            families=settings.streams,
            group=settings.consumer_group,
            state_ttl_s=settings.state_ttl_s,
            markers_ttl_s=settings.published_ttl_s,
            history_size=settings.history_size,
        )
        view = await store.view(domain, job)
    snapshot = orjson.loads(view.state) if view.state else None
    history = [orjson.loads(p) for p in view.history]
    if as_json:
        shown = {"state": snapshot, "history": history, "streams_redis": server.as_json()}
        say(json.dumps(shown, ensure_ascii=False), out)
        return 0 if snapshot is not None else 1
    say(server.line(), out)
    if snapshot is None:
        say(f"no state for {domain} job {job!r} on {server.url} (unknown or expired)", out)
        return 1
    say(f"{domain} job {job}: {_line(snapshot)}", out)
    say(f"history ({plural(len(history), 'event')}):", out)
    for event in history:
        say(f"  {_line(event)}", out)
    return 0


async def dlq_list(
    settings: Settings, server: Server, *, domain: str | None, count: int, out: TextIO
) -> int:
    """The dead letters of `domain`, or of every configured domain (`count` at most each)."""
    from eco_router.adapters.redis.router.dead_letters import RedisDeadLetterArchive

    families = settings.streams if domain is None else (family_for(settings, domain),)
    async with streams_client(settings) as client:
        archive = RedisDeadLetterArchive(client)
        listings = []
        for family in families:
            letters = await archive.oldest(family, count=count)
            # Counted only when the listing is full, so a short one costs no second command.
            full = len(letters) == count
            total = (await archive.tally(family)).count if full else len(letters)
            listings.append((family, letters, total))
    say(server.line(), out)
    for family, letters, total in listings:
        if not letters:
            say(f"{family.dead_letter_stream} is empty", out)
        for letter in letters:
            fields = " ".join(
                f"{k.decode(errors='replace')}={_short(v)}" for k, v in letter.fields.items()
            )
            say(
                f"{letter.dlq_id}  {letter.reason:<22} {letter.stream} {letter.entry_id} "
                f"deliveries={letter.deliveries}  {letter.detail}",
                out,
            )
            say(f"    {fields}", out)
        if total > len(letters):
            say(
                f"… {total - len(letters)} more in {family.dead_letter_stream}; "
                f"--count {total} shows every one",
                out,
            )
    return 0


async def dlq_replay(
    settings: Settings,
    server: Server,
    *,
    domain: str,
    ids: list[str],
    replay_all: bool,
    out: TextIO,
    err: TextIO | None = None,
) -> int:
    """Replay dead letters; when an id is not found, say so for each and replay nothing."""
    if replay_all == bool(ids):
        raise UsageError("give dead-letter ids or --all, not both and not neither")
    from eco_router.adapters.redis.router.dead_letters import (
        MissingDeadLetters,
        RedisDeadLetterArchive,
    )

    family = family_for(settings, domain)
    async with streams_client(settings) as client:
        try:
            replayed = await RedisDeadLetterArchive(client).replay(
                family, None if replay_all else ids
            )
        except MissingDeadLetters as error:
            say(f"eco-router dlq replay: {server.line()}", err or sys.stderr)
            for problem in error.missing:
                say(f"eco-router dlq replay: {problem}", err or sys.stderr)
            say("eco-router dlq replay: nothing replayed", err or sys.stderr)
            return 2
        except ValueError as error:
            raise UsageError(str(error)) from error
    say(server.line(), out)
    for item in replayed:
        say(f"{item.dlq_id} -> {item.stream} {item.new_id}", out)
    say(f"replayed {plural(len(replayed), 'dead letter')}", out)
    return 0


async def status(settings: Settings, server: Server, *, as_json: bool, out: TextIO) -> int:
    """The live routers and, per shard, its holder, lease and the group's lag and pending."""
    from eco_router.adapters.redis.connections.slots import nodes_of
    from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
    from eco_router.adapters.redis.router.lease_store import RedisLeaseStore

    async with streams_client(settings) as client:
        leases = RedisLeaseStore(
            client,
            families=settings.streams,
            group=settings.consumer_group,
            ttl_ms=settings.lease_ttl_ms,
        )
        source = RedisStreamEventSource(
            client,
            families=settings.streams,
            group=settings.consumer_group,
            consumer="eco-router-cli",
        )
        view = await leases.view()
        stats = await source.shard_stats()
        nodes = nodes_of(client, (s.stream for s in stats))
    report = _status_report(settings.consumer_group, view, stats, nodes)
    if as_json:
        say(json.dumps({**report, "streams_redis": server.as_json()}, ensure_ascii=False), out)
    else:
        say(server.line(), out)
        for line in _status_lines(report):
            say(line, out)
    return 0


def _status_report(
    group: str, view: GroupView, stats: Sequence[ShardStats], nodes: Mapping[str, str]
) -> dict[str, Any]:
    """The status as plain values (what --json prints); times in ms on the server's clock.
    On a Redis Cluster each shard also names the master that holds it."""
    now = view.now_ms
    shards = []
    for stat in stats:
        lease = view.leases.get(stat.stream)
        shards.append(
            {
                "stream": stat.stream,
                "domain": stat.family.domain,
                "shard": stat.shard,
                "holder": lease.owner if lease else None,
                "since_ms": lease.since_ms if lease else None,
                "held_for_ms": max(now - lease.since_ms, 0) if lease else None,
                "token": lease.token if lease else None,
                "lease_expires_in_ms": max(lease.expires_ms - now, 0) if lease else None,
                "lag": stat.lag,
                "pending": stat.pending,
                **({"node": nodes[stat.stream]} if stat.stream in nodes else {}),
            }
        )
    routers = [
        {
            "name": name,
            "lease_expires_in_ms": max(expires_ms - now, 0),
            "shards": sum(1 for s in shards if s["holder"] == name),
        }
        for name, expires_ms in sorted(view.routers.items())
    ]
    return {"group": group, "now_ms": now, "routers": routers, "shards": shards}


def _status_lines(report: dict[str, Any]) -> list[str]:
    routers, shards = report["routers"], report["shards"]
    held = sum(1 for s in shards if s["holder"] is not None)
    lag = str(sum(s["lag"] or 0 for s in shards))
    unknown = sum(1 for s in shards if s["lag"] is None)
    if unknown:
        lag += f" ({plural(unknown, 'shard')} unknown)"
    pending = sum(s["pending"] for s in shards)
    alive = f"{plural(len(routers), 'router')} alive"
    lines = [
        f"group {report['group']}: {alive}, {held}/{len(shards)} shards held, "
        f"lag {lag}, pending {pending}",
        "",
    ]
    if routers:
        lines += _table(
            ["ROUTER", "LEASE EXPIRES IN", "SHARDS"],
            [[r["name"], _duration(r["lease_expires_in_ms"]), r["shards"]] for r in routers],
        )
    else:
        lines.append("no router alive")
    lines.append("")
    rows = []
    for s in shards:
        since = "-"
        if s["since_ms"] is not None:
            started = datetime.fromtimestamp(s["since_ms"] / 1000, tz=UTC)
            since = f"{started:%Y-%m-%d %H:%M:%S}Z ({_duration(s['held_for_ms'])} ago)"
        row = [s["stream"], s["holder"] or "-", since, s["token"], s["lag"], s["pending"]]
        rows.append(row + ([s["node"]] if "node" in s else []))
    header = ["SHARD", "HOLDER", "SINCE", "TOKEN", "LAG", "PENDING"]
    lines += _table(header + (["NODE"] if any("node" in s for s in shards) else []), rows)
    return lines


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Aligned columns: numbers to the right, text to the left, None as '-'."""
    cells = [header] + [["-" if v is None else printable(str(v)) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [
        all(isinstance(row[i], int) or row[i] is None for row in rows) for i in range(len(header))
    ]
    return [
        "  ".join(
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ).rstrip()
        for row in cells
    ]


def _duration(ms: int) -> str:
    """A short human duration: 850 ms, 3.2 s, 42 s, 5m 03s, 2h 05m, 3d 04h."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def _describe(tally: DemoTally, jobs: int, *, failed: Sequence[str] = ()) -> str:
    """The demo's progress line; the last one also names the jobs that failed."""
    done = tally.jobs_finished + tally.jobs_failed
    failures = f"{tally.jobs_failed} failed"
    if failed:
        failures += f": {', '.join(failed)}"
    return (
        f"jobs {done}/{jobs} finished ({failures}) · events {tally.events} "
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
            print(f"\r{printable(text)}\033[K", end="", file=self._out, flush=True)
        elif self._count % 100 == 0:
            say(text, self._out, flush=True)

    def note(self, text: str) -> None:
        """A line of its own, above the status line."""
        print(f"\r{text}\033[K" if self._tty else text, file=self._out, flush=True)

    def finish(self, text: str) -> None:
        text = printable(text)
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


def say(text: str, out: TextIO, *, flush: bool = False) -> None:
    """Print one line of output; stored strings in it are made `printable` first."""
    print(printable(text), file=out, flush=flush)
