"""The operator subcommands as an operator runs them: `eco-router` subprocesses on real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from eco_router import __version__
from eco_router.adapters.redis.router.lease_store import RedisLeaseStore
from eco_router.producer import AsyncStreamPublisher, producer_config
from eco_router.testing import RedisServer
from tests.integration.support import (
    ALL_STREAMS,
    FAMILIES,
    GROUP,
    SCAN,
    WorkerProcess,
    Workers,
    add_event,
    add_raw,
    eco_router,
    eventually,
    job_in_shard,
    job_state,
    pending_count,
    worker_env,
)

SUMMARY = re.compile(
    r"jobs (\d+)/(\d+) finished \((\d+) failed(?:: ([^)]+))?\) · events (\d+) \(\+(\d+) retried\)"
)


@pytest.fixture
def env(streams_server: RedisServer, pubsub_server: RedisServer, tmp_path: Path) -> dict[str, str]:
    """The environment an operator's shell would have: the servers and the stream families
    (and a runtime directory of its own, where no other test's serve announces itself)."""
    return worker_env(streams_server.url, pubsub_server.url, XDG_RUNTIME_DIR=str(tmp_path))


def server_line(url: str) -> str:
    """The first line of a command's text output, naming the server it talks to."""
    return f"streams redis: {url} (REDIS_STREAMS_URL)"


async def all_entries(redis: Redis) -> list[tuple[str, dict[bytes, bytes]]]:
    """Every entry on every `scan` shard."""
    found = []
    for stream in SCAN.streams:
        found += [(i.decode(), fields) for i, fields in await redis.xrange(stream)]
    return found


class TestPublish:
    async def test_publish_prints_the_stream_and_id_and_writes_the_entry(
        self, env: dict[str, str], streams_redis: Redis
    ) -> None:
        done = await eco_router(
            env,
            *("publish", "--job", "job-7", "--stage", "vision", "--status", "completed"),
            *("--progress", "25", "--result", '{"label": "chat noir 🐈"}'),
        )

        assert done.returncode == 0, done.stderr
        where, published = done.stdout.splitlines()
        assert where == server_line(env["REDIS_STREAMS_URL"])
        stream, entry_id = published.split()
        assert stream == SCAN.stream_for("job-7")
        [(found_id, fields)] = await streams_redis.xrange(stream)
        assert found_id.decode() == entry_id
        assert fields[b"seq"] == b"11"
        assert fields[b"progress"] == b"25"
        assert fields[b"result"] == '{"label":"chat noir 🐈"}'.encode()

    async def test_publishing_the_same_event_again_prints_the_first_id(
        self, env: dict[str, str], streams_redis: Redis
    ) -> None:
        args = ("publish", "--job", "job-7", "--stage", "rule", "--status", "started")
        first = await eco_router(env, *args)
        again = await eco_router(env, *args)

        assert (first.returncode, again.returncode) == (0, 0)
        assert again.stdout == first.stdout
        assert await streams_redis.xlen(SCAN.stream_for("job-7")) == 1

    async def test_the_reference_designs_queued_and_done_are_published_as_such(
        self, env: dict[str, str], streams_redis: Redis
    ) -> None:
        base = ("publish", "--job", "job-7")
        queued = await eco_router(env, *base, "--stage", "queued", "--status", "started")
        done = await eco_router(
            env,
            *(*base, "--stage", "done", "--status", "completed"),
            *("--result", '{"answer": "정상입니다"}', "--progress", "100"),
        )
        again = await eco_router(env, *base, "--stage", "done", "--status", "completed")

        assert (queued.returncode, done.returncode, again.returncode) == (0, 0, 0), done.stderr
        assert again.stdout == done.stdout
        fields = [f for _, f in await streams_redis.xrange(SCAN.stream_for("job-7"))]
        assert [(f[b"stage"], f[b"status"], f[b"seq"]) for f in fields] == [
            (b"queued", b"started", b"0"),
            (b"done", b"completed", b"51"),
        ]
        assert fields[1][b"result"].decode() == '{"answer":"정상입니다"}'

    async def test_stages_and_seq_options_set_the_seq(
        self, env: dict[str, str], streams_redis: Redis
    ) -> None:
        base = ("publish", "--job", "job-7", "--status", "completed")
        by_plan = await eco_router(env, *base, "--stage", "classify", "--stages", "ocr,classify")
        explicit = await eco_router(env, *base, "--stage", "upload", "--seq", "3")

        assert (by_plan.returncode, explicit.returncode) == (0, 0), by_plan.stderr
        fields = [f for _, f in await streams_redis.xrange(SCAN.stream_for("job-7"))]
        assert [(f[b"stage"], f[b"seq"]) for f in fields] == [
            (b"classify", b"21"),
            (b"upload", b"3"),
        ]

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (("--job", "job 7"), "job_id 'job 7' must be 1-128 characters"),
            (("--job", "j" * 129), "must be 1-128 characters"),
            (("--progress", "101"), "progress 101 must be an integer from 0 to 100"),
            (("--result", "{not json"), "--result is not JSON"),
            (("--result", '{"score": NaN}'), "no NaN or infinity"),
            (("--stage", "upload"), "'upload' is not in the plan"),
            (("--status", "running"), "invalid choice: 'running'"),
            (("--domain", "billing"), "unknown domain 'billing'"),
        ],
        ids=[
            "space-in-job",
            "long-job",
            "progress",
            "result-not-json",
            "nan-result",
            "stage",
            "status",
            "domain",
        ],
    )
    async def test_bad_input_exits_2_with_a_message_and_writes_nothing(
        self,
        env: dict[str, str],
        streams_redis: Redis,
        options: tuple[str, ...],
        message: str,
    ) -> None:
        values = {"--job": "job-7", "--stage": "vision", "--status": "started"}
        values.update(dict(zip(options[::2], options[1::2], strict=True)))

        done = await eco_router(env, "publish", *(x for pair in values.items() for x in pair))

        assert done.returncode == 2
        assert message in done.stderr
        assert "Traceback" not in done.stderr
        assert await streams_redis.dbsize() == 0


class TestState:
    async def test_state_prints_the_snapshot_and_the_history_of_a_routed_job(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis
    ) -> None:
        await workers.start()
        publisher = AsyncStreamPublisher(streams_redis, producer_config())
        await publisher.publish_stage_event("job-7", "queued", "queued", progress=0)
        await publisher.publish_stage_event("job-7", "vision", "started", progress=5)
        await publisher.publish_stage_event(
            "job-7", "vision", "completed", progress=25, result={"label": "chat 🐈"}
        )
        await eventually(
            lambda: _seq_reached(streams_redis, "job-7", 11), what="job-7 routed up to seq 11"
        )

        done = await eco_router(env, "state", "job-7")

        assert done.returncode == 0, done.stderr
        where, *lines = done.stdout.splitlines()
        assert where == server_line(env["REDIS_STREAMS_URL"])
        assert lines[0].startswith("scan job job-7: seq=11  vision/completed  25%")
        assert 'result={"label": "chat 🐈"}' in lines[0]
        assert lines[1] == "history (3 events):"
        assert [line.split()[0] for line in lines[2:]] == ["seq=0", "seq=10", "seq=11"]

    async def test_a_history_of_one_event_says_one_event(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis
    ) -> None:
        await workers.start()
        publisher = AsyncStreamPublisher(streams_redis, producer_config())
        await publisher.publish_stage_event("job-1", "queued", "queued", progress=0)
        await eventually(lambda: job_state(streams_redis, "job-1"), what="job-1 routed")

        done = await eco_router(env, "state", "job-1")

        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[2] == "history (1 event):"

    async def test_state_json_is_the_snapshot_and_history_as_json(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis
    ) -> None:
        await workers.start()
        publisher = AsyncStreamPublisher(streams_redis, producer_config())
        await publisher.publish_stage_event("job-7", "queued", "queued")
        await publisher.publish_stage_event("job-7", "rule", "failed", result={"error": "é"})
        await eventually(
            lambda: _seq_reached(streams_redis, "job-7", 22), what="job-7 routed up to seq 22"
        )

        done = await eco_router(env, "state", "--json", "job-7")

        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)
        assert shown["state"]["seq"] == 22
        assert shown["state"]["result"] == {"error": "é"}
        assert [event["seq"] for event in shown["history"]] == [0, 22]
        assert shown["state"] == await job_state(streams_redis, "job-7")

    @pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
    async def test_control_characters_in_a_stored_event_reach_the_terminal_escaped(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis, as_json: bool
    ) -> None:
        # ESC, a C1 CSI (an escape on its own in some terminals) and a right-to-left override.
        stage = "vis\x1b[31mion\x9b2J\u202eevil"
        await workers.start()
        await add_raw(
            streams_redis,
            SCAN.stream_for("job-esc"),
            {b"job_id": b"job-esc", b"seq": b"3", b"stage": stage.encode()},
        )
        await eventually(lambda: _seq_reached(streams_redis, "job-esc", 3), what="job-esc routed")

        done = await eco_router(env, "state", *(["--json"] if as_json else []), "job-esc")

        assert done.returncode == 0, done.stderr
        assert not {"\x1b", "\x9b", "\u202e"} & set(done.stdout)
        if as_json:
            assert json.loads(done.stdout)["state"]["stage"] == stage
        else:
            assert "vis\\u001b[31mion\\u009b2J\\u202eevil" in done.stdout

    @pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
    async def test_an_unknown_job_exits_1(self, env: dict[str, str], as_json: bool) -> None:
        done = await eco_router(env, "state", *(["--json"] if as_json else []), "nobody")

        url = env["REDIS_STREAMS_URL"]
        assert done.returncode == 1
        if as_json:
            assert json.loads(done.stdout) == {
                "state": None,
                "history": [],
                "streams_redis": {"url": url, "via": "REDIS_STREAMS_URL"},
            }
        else:
            assert done.stdout.splitlines() == [
                server_line(url),
                f"no state for scan job 'nobody' on {url} (unknown or expired)",
            ]

    async def test_a_job_id_publish_would_refuse_is_refused_alike_with_exit_2(
        self, env: dict[str, str]
    ) -> None:
        state = await eco_router(env, "state", "bad id")
        publish = await eco_router(
            env, "publish", "--job", "bad id", "--stage", "vision", "--status", "started"
        )

        assert (state.returncode, publish.returncode) == (2, 2)
        reason = "argument job: job_id 'bad id' must be 1-128 characters of [A-Za-z0-9_.:-]"
        assert state.stderr.splitlines() == [
            f"eco-router state: error: {reason} (see eco-router state --help)"
        ]
        assert publish.stderr.splitlines() == [
            "eco-router publish: error: argument --job: job_id 'bad id' must be 1-128 "
            "characters of [A-Za-z0-9_.:-] (see eco-router publish --help)"
        ]
        assert state.stdout == publish.stdout == ""


async def _seq_reached(redis: Redis, job_id: str, seq: int) -> bool:
    state = await job_state(redis, job_id)
    return state is not None and state["seq"] == seq


class TestDemo:
    async def test_demo_runs_every_job_to_done_or_failed_through_the_router(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis
    ) -> None:
        await workers.start()

        done = await eco_router(env, "demo", "--jobs", "10", "--rate", "600")

        assert done.returncode == 0, done.stderr
        summary = SUMMARY.search(done.stdout.splitlines()[-1])
        assert summary is not None, done.stdout
        finished, total, failed = map(int, summary.group(1, 2, 3))
        events = int(summary.group(5))
        named = summary.group(4).split(", ") if summary.group(4) else []
        assert (finished, total) == (10, 10)
        entries = await all_entries(streams_redis)
        assert len(entries) == events  # retries were absorbed by the producer's idempotency
        jobs = {fields[b"job_id"].decode() for _, fields in entries}
        assert len(jobs) == 10

        async def final_statuses() -> dict[str, str] | None:
            states = {job: await job_state(streams_redis, job) for job in sorted(jobs)}
            statuses = {job: s["status"] for job, s in states.items() if s is not None}
            done_or_failed = len(statuses) == 10 and set(statuses.values()) <= {"done", "failed"}
            return statuses if done_or_failed else None

        statuses = await eventually(final_statuses, what="every demo job done or failed")
        assert sorted(named) == sorted(j for j, status in statuses.items() if status == "failed")
        assert len(named) == failed

    async def test_sigint_stops_the_demo_cleanly(
        self, env: dict[str, str], streams_redis: Redis
    ) -> None:
        process = await asyncio.create_subprocess_exec(
            *WorkerProcess.command(),
            *("demo", "--jobs", "1000", "--rate", "5"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            await eventually(lambda: all_entries(streams_redis), what="the first demo entries")
            process.send_signal(signal.SIGINT)
            async with asyncio.timeout(20):
                out, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        stdout, stderr = out.decode(), err.decode()

        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr
        last = stdout.splitlines()[-1]
        assert last.endswith("(stopped)")
        summary = SUMMARY.search(last)
        assert summary is not None, stdout
        assert int(summary.group(1)) < 1000
        assert int(summary.group(5)) == len(await all_entries(streams_redis))


# Entries no producer would write: the router dead-letters them with these reasons.
BAD_ENTRIES = {
    "missing_seq": (
        SCAN.stream_for("job-noseq"),
        # An escape sequence that clears the screen, then one that turns it red.
        {b"job_id": b"job-noseq", b"stage": b"vision", b"note": b"\x1b[2J\x1b[31mred"},
    ),
    "not_utf8": (
        SCAN.stream_for("job-bin"),
        {b"job_id": b"job-bin", b"seq": b"10", b"stage": b"\xff\xfe vis\xc3", b"note": b"\x00"},
    ),
}


class DeadLettered:
    """The bad entries as written: reason → (stream, entry id, fields in order)."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, str, list[tuple[bytes, bytes]]]] = {}

    def dlq_id_of(self, listing: str, reason: str) -> str:
        """The dead-letter id `dlq list` shows for the entry dead-lettered for `reason`."""
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) > 1 and parts[1] == reason:
                return parts[0]
        raise AssertionError(f"no {reason} line in:\n{listing}")


@pytest.fixture
async def dead_lettered(workers: Workers, streams_redis: Redis) -> DeadLettered:
    """The bad entries, dead-lettered by a worker that has then stopped."""
    worker = await workers.start()
    written = DeadLettered()
    for reason, (stream, fields) in BAD_ENTRIES.items():
        entry_id = await add_raw(streams_redis, stream, fields)
        written.entries[reason] = (stream, entry_id, list(fields.items()))
    await eventually(
        lambda: _xlen_is(streams_redis, SCAN.dead_letter_stream, len(BAD_ENTRIES)),
        what="both entries dead-lettered",
    )
    # Stopped, so a replayed entry stays where the replay put it.
    worker.terminate()
    assert await worker.wait_exit() == 0
    return written


async def _xlen_is(redis: Redis, stream: str, length: int) -> bool:
    return bool(await redis.xlen(stream) == length)


async def _fields_of(redis: Redis, stream: str, entry_id: str) -> list[tuple[bytes, bytes]]:
    [(_, fields)] = await redis.xrange(stream, entry_id, entry_id)
    return list(fields.items())


class TestDeadLetters:
    async def test_dlq_list_shows_each_dead_letter_with_its_origin_and_reason(
        self, env: dict[str, str], dead_lettered: DeadLettered, streams_redis: Redis
    ) -> None:
        done = await eco_router(env, "dlq", "list")

        assert done.returncode == 0, done.stderr
        dlq_ids = [i.decode() for i, _ in await streams_redis.xrange(SCAN.dead_letter_stream)]
        for reason, (stream, entry_id, _) in dead_lettered.entries.items():
            dlq_id = dead_lettered.dlq_id_of(done.stdout, reason)
            assert dlq_id in dlq_ids
            line = next(x for x in done.stdout.splitlines() if x.startswith(dlq_id))
            assert f"{stream} {entry_id}" in line
            assert "deliveries=1" in line
        assert "job_id=job-noseq" in done.stdout

    async def test_dlq_list_shows_control_characters_escaped_not_raw(
        self, env: dict[str, str], dead_lettered: DeadLettered
    ) -> None:
        done = await eco_router(env, "dlq", "list")

        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout
        assert "note=\\u001b[2J\\u001b[31mred" in done.stdout
        assert "\x00" not in done.stdout

    async def test_dlq_list_says_how_many_more_letters_count_left_out(
        self, env: dict[str, str], dead_lettered: DeadLettered
    ) -> None:
        done = await eco_router(env, "dlq", "list", "--count", "1")
        every = await eco_router(env, "dlq", "list", "--count", "2")

        assert done.returncode == 0, done.stderr
        assert "… 1 more in scan:events:dlq; --count 2 shows every one" in done.stdout.splitlines()
        assert not any(line.startswith("…") for line in every.stdout.splitlines())

    async def test_a_reader_that_stops_early_ends_the_listing_quietly(
        self, env: dict[str, str], dead_lettered: DeadLettered
    ) -> None:
        read_end, write_end = os.pipe()
        os.close(read_end)  # as `| head -2` has by the time more lines come
        try:
            done = await asyncio.to_thread(
                subprocess.run,
                [*WorkerProcess.command(), "dlq", "list"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        finally:
            os.close(write_end)

        assert done.returncode == 141
        assert done.stderr == ""

    async def test_dlq_list_says_when_the_dead_letter_stream_is_empty(
        self, env: dict[str, str]
    ) -> None:
        done = await eco_router(env, "dlq", "list")

        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            server_line(env["REDIS_STREAMS_URL"]),
            *(f"{family.dead_letter_stream} is empty" for family in FAMILIES),
        ]

    async def test_dlq_list_covers_every_domain_unless_one_is_named(
        self, env: dict[str, str], dead_lettered: DeadLettered, workers: Workers,
        streams_redis: Redis,
    ) -> None:  # fmt: skip
        chat = next(f for f in FAMILIES if f.domain == "chat")
        worker = await workers.start()
        await streams_redis.xadd(chat.stream_for("job-chat"), {"job_id": "job-chat"})
        await eventually(
            lambda: _xlen_is(streams_redis, chat.dead_letter_stream, 1), what="the chat letter"
        )
        worker.terminate()
        assert await worker.wait_exit() == 0

        every = await eco_router(env, "dlq", "list")
        scan_only = await eco_router(env, "dlq", "list", "--domain", "scan")

        assert "job_id=job-chat" in every.stdout
        assert "job_id=job-noseq" in every.stdout
        assert "job_id=job-chat" not in scan_only.stdout

    async def test_replay_of_one_id_puts_the_original_fields_back_and_removes_it(
        self, env: dict[str, str], dead_lettered: DeadLettered, streams_redis: Redis
    ) -> None:
        listing = (await eco_router(env, "dlq", "list")).stdout
        dlq_id = dead_lettered.dlq_id_of(listing, "not_utf8")
        other_id = dead_lettered.dlq_id_of(listing, "missing_seq")

        done = await eco_router(env, "dlq", "replay", dlq_id)

        assert done.returncode == 0, done.stderr
        stream, _, original = dead_lettered.entries["not_utf8"]
        match = re.search(rf"^{dlq_id} -> {stream} (\S+)$", done.stdout, re.MULTILINE)
        assert match is not None, done.stdout
        assert await _fields_of(streams_redis, stream, match.group(1)) == original
        assert done.stdout.splitlines()[-1] == "replayed 1 dead letter"
        remaining = [i.decode() for i, _ in await streams_redis.xrange(SCAN.dead_letter_stream)]
        assert remaining == [other_id]

    async def test_replay_all_puts_every_dead_letter_back_and_empties_the_stream(
        self, env: dict[str, str], dead_lettered: DeadLettered, streams_redis: Redis
    ) -> None:
        done = await eco_router(env, "dlq", "replay", "--all")

        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "replayed 2 dead letters"
        new_entries = re.findall(r"^\S+ -> (\S+) (\S+)$", done.stdout, re.MULTILINE)
        replayed = [(s, await _fields_of(streams_redis, s, i)) for s, i in new_entries]
        originals = [(stream, fields) for stream, _, fields in dead_lettered.entries.values()]
        assert sorted(replayed) == sorted(originals)
        assert await streams_redis.xlen(SCAN.dead_letter_stream) == 0

    @pytest.mark.parametrize(
        "args", [(), ("1-0", "--all")], ids=["neither-ids-nor-all", "both-ids-and-all"]
    )
    async def test_replay_needs_ids_or_all(
        self, env: dict[str, str], args: tuple[str, ...]
    ) -> None:
        done = await eco_router(env, "dlq", "replay", *args)

        assert done.returncode == 2
        assert "give dead-letter ids or --all" in done.stderr

    async def test_replay_of_an_unknown_id_exits_2_and_changes_nothing(
        self, env: dict[str, str], dead_lettered: DeadLettered, streams_redis: Redis
    ) -> None:
        before = await all_entries(streams_redis)

        done = await eco_router(env, "dlq", "replay", "1-1")

        assert done.returncode == 2
        assert "no dead letter 1-1 in scan:events:dlq" in done.stderr
        assert await all_entries(streams_redis) == before
        assert await streams_redis.xlen(SCAN.dead_letter_stream) == len(BAD_ENTRIES)

    async def test_replay_names_every_id_it_cannot_find_and_replays_nothing(
        self, env: dict[str, str], dead_lettered: DeadLettered, streams_redis: Redis
    ) -> None:
        listing = (await eco_router(env, "dlq", "list")).stdout
        known = dead_lettered.dlq_id_of(listing, "not_utf8")
        bare_ms = known.partition("-")[0]
        before = await all_entries(streams_redis)

        done = await eco_router(env, "dlq", "replay", known, "1-1", "abc", bare_ms, "2-2")

        assert done.returncode == 2
        errors = done.stderr.splitlines()
        assert errors == [
            f"eco-router dlq replay: {server_line(env['REDIS_STREAMS_URL'])}",
            "eco-router dlq replay: 'abc' is not a dead-letter id "
            "(MILLISECONDS-SEQUENCE, as `dlq list` shows)",
            f"eco-router dlq replay: {bare_ms!r} is not a dead-letter id "
            "(MILLISECONDS-SEQUENCE, as `dlq list` shows)",
            "eco-router dlq replay: no dead letter 1-1 in scan:events:dlq",
            "eco-router dlq replay: no dead letter 2-2 in scan:events:dlq",
            "eco-router dlq replay: nothing replayed",
        ]
        assert done.stdout == ""
        assert await all_entries(streams_redis) == before
        assert await streams_redis.xlen(SCAN.dead_letter_stream) == len(BAD_ENTRIES)


async def holders(redis: Redis) -> dict[str, str]:
    """Stream → holder of every live shard lease of the group."""
    view = await RedisLeaseStore(redis, families=FAMILIES, group=GROUP, ttl_ms=4000).view()
    return view.owners()


async def held_by(redis: Redis, name: str) -> bool:
    return await holders(redis) == dict.fromkeys(ALL_STREAMS, name)


def shard_rows(stdout: str) -> dict[str, list[str]]:
    """The shard table of `status`: stream → its other columns, split on runs of spaces."""
    rows = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in ALL_STREAMS:
            rows[cells[0]] = cells[1:]
    return rows


class TestStatus:
    async def test_status_shows_the_worker_holding_every_shard_with_lag_and_pending(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis
    ) -> None:
        worker = await workers.start()
        await eventually(lambda: held_by(streams_redis, worker.name), what="every shard held")
        for n in range(5):
            await add_event(streams_redis, f"job-{n}", 1, stage="vision", status="started")
        await eventually(lambda: job_state(streams_redis, "job-4"), what="job-4 routed")
        await eventually(lambda: _no_pending(streams_redis), what="every routed entry acked")

        text = await eco_router(env, "status")
        as_json = await eco_router(env, "status", "--json")

        assert text.returncode == 0, text.stderr
        where, *lines = text.stdout.splitlines()
        assert where == server_line(env["REDIS_STREAMS_URL"])
        assert lines[0] == (f"group {GROUP}: 1 router alive, 6/6 shards held, lag 0, pending 0")
        assert re.search(rf"^{worker.name}\s+[0-9.]+ (ms|s)\s+6$", text.stdout, re.MULTILINE)
        rows = shard_rows(text.stdout)
        assert list(rows) == list(ALL_STREAMS)
        for holder, since, token, lag, pending in rows.values():
            assert holder == worker.name
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \(.+ ago\)", since)
            assert (token, lag, pending) == ("1", "0", "0")

        assert as_json.returncode == 0, as_json.stderr
        shown = json.loads(as_json.stdout)
        assert shown["streams_redis"] == {
            "url": env["REDIS_STREAMS_URL"],
            "via": "REDIS_STREAMS_URL",
        }
        assert shown["group"] == GROUP
        [router] = shown["routers"]
        assert router["name"] == worker.name
        assert 0 < router["lease_expires_in_ms"] <= 4000
        assert router["shards"] == len(ALL_STREAMS)
        assert [s["stream"] for s in shown["shards"]] == list(ALL_STREAMS)
        for shard in shown["shards"]:
            assert shard["holder"] == worker.name
            assert shard["token"] == 1
            assert 0 <= shard["held_for_ms"] == shown["now_ms"] - shard["since_ms"]
            assert 0 < shard["lease_expires_in_ms"] <= 4000
            assert (shard["lag"], shard["pending"]) == (0, 0)

    async def test_after_the_worker_stops_no_shard_has_a_holder(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis
    ) -> None:
        worker = await workers.start()
        await eventually(lambda: held_by(streams_redis, worker.name), what="every shard held")
        worker.terminate()
        assert await worker.wait_exit() == 0
        # Waiting while no router runs: three new entries, one of them read by a consumer
        # that never acks it.
        job = job_in_shard(SCAN, 1, "late")
        for seq in range(3):
            await add_event(streams_redis, job, seq)
        await streams_redis.xreadgroup(GROUP, "gone", {SCAN.streams[1]: ">"}, count=1)

        text = await eco_router(env, "status")
        as_json = await eco_router(env, "status", "--json")

        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()[1:]
        assert lines[0] == f"group {GROUP}: 0 routers alive, 0/6 shards held, lag 2, pending 1"
        assert "no router alive" in lines
        rows = shard_rows(text.stdout)
        assert rows[SCAN.streams[1]] == ["-", "-", "-", "2", "1"]
        assert all(row[0] == "-" for row in rows.values())

        shown = json.loads(as_json.stdout)
        assert shown["routers"] == []
        assert all(s["holder"] is None and s["token"] is None for s in shown["shards"])
        by_stream = {s["stream"]: s for s in shown["shards"]}
        assert (by_stream[SCAN.streams[1]]["lag"], by_stream[SCAN.streams[1]]["pending"]) == (2, 1)

    async def test_an_unreachable_streams_server_is_the_workers_line_and_exit_3(
        self, env: dict[str, str]
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"redis://127.0.0.1:{port}/0"

        done = await eco_router({**env, "REDIS_STREAMS_URL": url}, "status")

        assert done.returncode == 3
        assert done.stdout == ""
        assert done.stderr.splitlines() == [
            f"error: cannot reach the streams Redis at {url}: connection refused"
        ]

    async def test_a_server_that_needs_a_password_the_url_lacks_is_exit_2(
        self, env: dict[str, str]
    ) -> None:
        with RedisServer() as server:
            # Set once it runs: the fixture's readiness PING carries no password.
            await asyncio.to_thread(_require_password, server.port)
            done = await eco_router({**env, "REDIS_STREAMS_URL": server.url}, "status")

        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"error: the streams Redis at {server.url} refused the credentials: "
            "it needs a password and the URL has none"
        ]

    async def test_a_database_the_server_lacks_is_a_configuration_error_exit_2(
        self, env: dict[str, str], streams_server: RedisServer
    ) -> None:
        url = f"redis://127.0.0.1:{streams_server.port}/99"

        done = await eco_router({**env, "REDIS_STREAMS_URL": url}, "status")

        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"error: the streams Redis at {url} has no such database (DB index is out of "
            "range; the server's `databases` setting is lower)"
        ]


def _require_password(port: int) -> None:
    with SyncRedis(host="127.0.0.1", port=port) as client:
        client.config_set("requirepass", "s3cret")


async def _no_pending(redis: Redis) -> bool:
    return await pending_count(redis) == 0


class TestServeStartup:
    async def test_serve_with_an_unreachable_streams_server_is_one_line_and_exit_3(
        self, env: dict[str, str]
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"redis://router:s3cret@127.0.0.1:{port}/0"

        done = await eco_router({**env, "REDIS_STREAMS_URL": url}, "serve", "--port", "0")

        assert done.returncode == 3, done.stderr
        errors = [line for line in done.stderr.splitlines() if not line[:4].isdigit()]
        assert errors == [
            f"error: cannot reach the streams Redis at redis://router:***@127.0.0.1:{port}/0: "
            "connection refused"
        ]
        assert "s3cret" not in done.stderr + done.stdout

    async def test_serve_with_its_port_taken_starts_nothing_and_ends_with_one_line(
        self, env: dict[str, str]
    ) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = await eco_router(env, "serve", "--in-memory", "--port", str(port))

        assert done.returncode == 3, done.stderr
        (line,) = done.stderr.splitlines()
        suggested = re.fullmatch(
            f"error: cannot listen on 127.0.0.1:{port}: address already in use; "
            r"serve on a free one: --port (\d+) \(make run PORT=\1\)",
            line,
        )
        assert suggested is not None, line
        assert int(suggested[1]) != port

    async def test_the_startup_line_names_the_console_when_it_is_on(
        self, env: dict[str, str]
    ) -> None:
        process = await asyncio.create_subprocess_exec(
            *WorkerProcess.command(),
            *("serve", "--in-memory", "--port", "0"),
            env={**env, "EVENT_ROUTER_CONSOLE": "true"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            async with asyncio.timeout(30):
                line = ""
                while "open http://" not in line:
                    line = (await process.stderr.readline()).decode()
                    assert line, "serve ended before its startup line"
        finally:
            process.terminate()
            await process.wait()

        match = re.search(r"open (http://127\.0\.0\.1:\d+)/ in a browser", line)
        assert match is not None, line
        assert f"the operator console is at {match.group(1)}/console" in line


class HttpOnly:
    """A port that answers every connection as a web server would: `HTTP/1.1 400`."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> HttpOnly:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()


class TestNotRedis:
    @pytest.mark.parametrize(
        "command",
        [("status",), ("state", "job-7"), ("serve", "--port", "0"), ("worker",)],
        ids=["status", "state", "serve", "worker"],
    )
    async def test_a_server_that_answers_in_http_is_named_as_not_redis_exit_3(
        self, env: dict[str, str], command: tuple[str, ...]
    ) -> None:
        async with HttpOnly() as http:
            url = f"redis://user:s3cret@127.0.0.1:{http.port}/0"
            done = await eco_router({**env, "REDIS_STREAMS_URL": url}, *command)

        assert done.returncode == 3, done.stderr
        errors = [line for line in done.stderr.splitlines() if not line[:4].isdigit()]
        assert errors == [
            f"error: the streams server at redis://user:***@127.0.0.1:{http.port}/0 is not a "
            "Redis server (it answered like an HTTP server)"
        ]
        assert done.stdout == ""


PUBLISH = ("publish", "--job", "j", "--stage", "vision", "--status", "started")


class TestArgumentErrors:
    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (
                (*PUBLISH, "--progress", "abc"),
                "eco-router publish: error: argument --progress: 'abc' is not an integer",
            ),
            (
                (*PUBLISH, "--seq", "1.5"),
                "eco-router publish: error: argument --seq: '1.5' is not an integer",
            ),
            (
                ("demo", "--jobs", "0"),
                "eco-router demo: error: argument --jobs: '0' is not a positive integer",
            ),
            (
                ("dlq", "list", "--count", "many"),
                "eco-router dlq list: error: argument --count: 'many' is not a positive integer",
            ),
            (
                ("serve", "--port", "http"),
                "eco-router serve: error: argument --port: 'http' is not a port number (0-65535)",
            ),
            (
                ("serve", "--in-memory", "--no-router"),
                "eco-router serve: error: --no-router needs Redis, it cannot be combined with "
                "--in-memory",
            ),
            (
                ("serve", "--in-memory", "--embedded-redis"),
                "eco-router serve: error: --embedded-redis and --in-memory are two ways to run "
                "without a Redis of your own: choose one",
            ),
            (("status", "--verbose"), "eco-router: error: unrecognized arguments: --verbose"),
            (("publish", "--job", "j"), "eco-router publish: error: the following arguments"),
        ],
        ids=[
            "progress-not-int",
            "seq-not-int",
            "jobs-zero",
            "count-word",
            "port-word",
            "in-memory-no-router",
            "in-memory-embedded",
            "unknown-option",
            "missing-options",
        ],
    )
    async def test_an_argument_error_is_one_line_naming_the_command_and_its_help(
        self, env: dict[str, str], args: tuple[str, ...], message: str
    ) -> None:
        done = await eco_router(env, *args)

        assert done.returncode == 2
        [line] = done.stderr.splitlines()
        assert line.startswith(message), line
        assert line.endswith("--help)")
        assert done.stdout == ""


class TestHelpAndVersion:
    async def test_version_prints_the_package_version(self, env: dict[str, str]) -> None:
        done = await eco_router(env, "--version")

        assert done.returncode == 0
        assert done.stdout.strip() == f"eco-router {__version__}"

    async def test_help_shows_the_defaults_and_the_exit_statuses(self, env: dict[str, str]) -> None:
        top = await eco_router(env, "--help")
        serve = await eco_router(env, "serve", "--help")
        demo = await eco_router(env, "demo", "--help")
        worker = await eco_router(env, "worker", "--help")

        top_text = " ".join(top.stdout.split())
        assert "3 a Redis server or the port unavailable at startup" in top_text
        assert "or `dlq replay` ids that name no dead letter" in top_text
        assert "(default: 127.0.0.1)" in serve.stdout
        assert "(default: 8000)" in serve.stdout
        assert "(default: 20)" in demo.stdout
        assert "(default: scan)" in demo.stdout
        loops = "lease keeper, consumer, reclaimer, shard observer"
        assert loops in " ".join(worker.stdout.split())


class TestDemoJobIds:
    async def test_demo_prints_each_job_id_it_starts(
        self, env: dict[str, str], workers: Workers, streams_redis: Redis
    ) -> None:
        await workers.start()

        done = await eco_router(env, "demo", "--jobs", "3", "--rate", "300")

        assert done.returncode == 0, done.stderr
        printed = re.findall(r"^started scan job (\S+)$", done.stdout, flags=re.MULTILINE)
        published = {fields[b"job_id"].decode() for _, fields in await all_entries(streams_redis)}
        assert sorted(printed) == sorted(published)
        assert len(printed) == 3
