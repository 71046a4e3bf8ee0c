"""`eco-router worker` as a subprocess, end to end on real Redis servers."""

from __future__ import annotations

import socket
import subprocess

import orjson
from redis.asyncio import Redis

from eco_router.testing import RedisServer
from tests.integration.support import (
    CHAT,
    SCAN,
    PubSubCollector,
    WorkerProcess,
    Workers,
    add_event,
    eventually,
    job_state,
    pending_count,
    worker_env,
)


class TestRoutingByTheWorker:
    async def test_good_events_reach_a_subscriber_in_order_with_the_routed_shape(
        self, worker: WorkerProcess, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        ids = [
            await add_event(
                streams_redis,
                "scan-42",
                seq,
                stage="scanning",
                progress=str(seq * 20),
                result=orjson.dumps({"found": seq, "paths": ["/a"]}).decode(),
            )
            for seq in range(1, 6)
        ]
        chat_id = await add_event(streams_redis, "chat-7", 1, family=CHAT, status="done")

        await eventually(lambda: len(subscriber.messages) == 6, what="six messages")

        received = subscriber.for_job("scan-42")
        assert [p["seq"] for p in received] == [1, 2, 3, 4, 5]
        assert received[2] == {
            "event_id": 3,
            "prev_event_id": 2,
            "job_id": "scan-42",
            "seq": 3,
            "stage": "scanning",
            "progress": 60,
            "result": {"found": 3, "paths": ["/a"]},
            "stream_id": ids[2],
            "domain": "scan",
        }
        assert [p["stream_id"] for p in received] == ids
        assert subscriber.for_job("chat-7") == [
            {
                "event_id": 1,
                "job_id": "chat-7",
                "seq": 1,
                "status": "done",
                "stream_id": chat_id,
                "domain": "chat",
            }
        ]
        assert await job_state(streams_redis, "scan-42") == received[-1]
        assert await eventually(lambda: _nothing_pending(streams_redis), what="all acked")


class TestOpsEndpoints:
    async def test_health_ready_and_metrics_answer_while_both_servers_are_up(
        self, worker: WorkerProcess, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        await add_event(streams_redis, "scan-1", 1)
        await eventually(lambda: subscriber.seqs("scan-1") == [1], what="event routed")

        health = await worker.get("/health")
        ready = await worker.get("/ready")
        routed = await eventually(
            lambda: worker.metric("event_router_events_total", domain="scan", verdict="new"),
            what="a routed event counted",
        )

        assert health.status_code == 200
        assert ready.status_code == 200
        assert ready.json() == {
            "ready": True,
            "checks": {
                "streams": "ok",
                "pubsub": "ok",
                "consumer": "ok",
                "leases": "ok",
                "reclaimer": "ok",
                "observer": "ok",
            },
        }
        assert routed == 1

    async def test_ready_turns_503_when_the_pubsub_server_stops(
        self, worker: WorkerProcess, pubsub_server: RedisServer
    ) -> None:
        assert (await worker.get("/ready")).status_code == 200

        pubsub_server.stop()

        async def not_ready() -> bool:
            return (await worker.get("/ready")).status_code == 503

        await eventually(not_ready, what="/ready answers 503")
        body = (await worker.get("/ready")).json()
        assert body["ready"] is False
        assert body["checks"]["pubsub"].startswith("unreachable")
        assert body["checks"]["streams"] == "ok"
        assert (await worker.get("/health")).status_code == 200


class TestWorkerPort:
    async def test_the_worker_port_serves_no_gateway_and_no_demo_page(
        self, worker: WorkerProcess
    ) -> None:
        page = await worker.get("/")
        events = await worker.get("/api/v1/scan/scan-1/events")
        docs = await worker.get("/docs")

        assert (page.status_code, events.status_code, docs.status_code) == (404, 404, 404)
        assert (await worker.get("/metrics")).status_code == 200


class TestShutdown:
    async def test_sigterm_exits_0_and_leaves_nothing_pending(
        self, worker: WorkerProcess, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        await add_event(streams_redis, "scan-warm", 1)
        await eventually(lambda: subscriber.seqs("scan-warm") == [1], what="warm-up routed")
        for seq in range(1, 201):
            await add_event(streams_redis, f"scan-{seq % 7}", seq)

        worker.terminate()

        assert await worker.wait_exit(timeout_s=10) == 0
        assert await pending_count(streams_redis) == 0
        # Whatever the group handed out before the signal was published, not dropped.
        delivered = await _delivered_ids(streams_redis)
        assert delivered
        await eventually(
            lambda: delivered <= subscriber.stream_ids(), what="every delivered entry published"
        )
        assert "worker stopped" in worker.log()

    async def test_sigterm_while_a_batch_is_in_flight_drains_it(
        self,
        worker: WorkerProcess,
        subscriber: PubSubCollector,
        streams_redis: Redis,
        pubsub_redis: Redis,
    ) -> None:
        # PUBLISH waits while clients are paused for writes: the batch is read, applied and
        # stuck in its publish when the signal arrives.
        await pubsub_redis.client_pause(10_000, all=False)
        try:
            # One transaction, so the worker's blocked read takes all twenty as one batch.
            async with streams_redis.pipeline(transaction=True) as pipe:
                for seq in range(1, 21):
                    pipe.xadd(
                        SCAN.stream_for("scan-inflight"), {"job_id": "scan-inflight", "seq": seq}
                    )
                await pipe.execute()
            await eventually(
                lambda: _pending_is(streams_redis, 20), what="the batch held by the worker"
            )
            worker.terminate()
            await eventually(lambda: "stopping: draining" in worker.log(), what="drain began")
        finally:
            await pubsub_redis.client_unpause()

        assert await worker.wait_exit(timeout_s=10) == 0
        await eventually(
            lambda: subscriber.seqs("scan-inflight") == list(range(1, 21)),
            what="the in-flight batch published",
        )
        assert await pending_count(streams_redis) == 0


class TestConfiguration:
    def test_an_invalid_setting_exits_2_naming_the_variable(
        self, streams_server: RedisServer, pubsub_server: RedisServer
    ) -> None:
        env = worker_env(streams_server.url, pubsub_server.url, EVENT_ROUTER_READ_COUNT="abc")

        done = subprocess.run(
            [*WorkerProcess.command(), "worker"],
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )

        assert done.returncode == 2
        assert b"invalid configuration" in done.stderr
        assert b"EVENT_ROUTER_READ_COUNT" in done.stderr


async def _nothing_pending(redis: Redis) -> bool:
    return await pending_count(redis) == 0


async def _pending_is(redis: Redis, count: int) -> bool:
    return await pending_count(redis) == count


async def _delivered_ids(redis: Redis) -> set[str]:
    """Every entry id at or before its group's last-delivered id, over all shards."""
    delivered: set[str] = set()
    for stream in SCAN.streams:
        groups = await redis.xinfo_groups(stream)
        last = groups[0]["last-delivered-id"].decode() if groups else "0-0"
        if last == "0-0":
            continue
        delivered |= {i.decode() for i, _ in await redis.xrange(stream, "-", last)}
    return delivered


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _run_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WorkerProcess.command(), "worker"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _error_lines(output: str) -> list[str]:
    """Lines that are not log records (those start with a date)."""
    return [line for line in output.splitlines() if not line[:4].isdigit()]


class TestStartupErrors:
    def test_an_unreachable_streams_server_is_one_line_and_exit_3(
        self, pubsub_server: RedisServer
    ) -> None:
        url = f"redis://router:s3cret@127.0.0.1:{_unused_port()}/0"

        done = _run_worker(worker_env(url, pubsub_server.url))

        assert done.returncode == 3, done.stderr
        shown = url.replace("s3cret", "***")
        assert _error_lines(done.stderr) == [
            f"error: cannot reach the streams Redis at {shown}: connection refused"
        ]
        assert "Traceback" not in done.stderr
        assert "s3cret" not in done.stderr + done.stdout

    def test_an_unreachable_pubsub_server_is_one_line_and_exit_3(
        self, streams_server: RedisServer
    ) -> None:
        url = f"redis://127.0.0.1:{_unused_port()}/0"

        done = _run_worker(worker_env(streams_server.url, url))

        assert done.returncode == 3, done.stderr
        assert _error_lines(done.stderr) == [
            f"error: cannot reach the Pub/Sub Redis at {url}: connection refused"
        ]

    def test_refused_credentials_are_a_configuration_error_exit_2(self) -> None:
        user = ["--user", "router", "on", ">s3cret", "~*", "&*", "+@all"]
        with RedisServer(extra_args=user) as server:
            url = f"redis://router:wrong@127.0.0.1:{server.port}/0"
            done = _run_worker(worker_env(url, url))

        assert done.returncode == 2, done.stderr
        assert _error_lines(done.stderr) == [
            f"error: the streams Redis at redis://router:***@127.0.0.1:{server.port}/0 refused "
            "the credentials: wrong user name or password, or the user is disabled"
        ]

    def test_a_database_the_server_lacks_is_a_configuration_error_exit_2(
        self, streams_server: RedisServer, pubsub_server: RedisServer
    ) -> None:
        url = f"redis://127.0.0.1:{pubsub_server.port}/99"

        done = _run_worker(worker_env(streams_server.url, url))

        assert done.returncode == 2, done.stderr
        assert _error_lines(done.stderr) == [
            f"error: the Pub/Sub Redis at {url} has no such database (DB index is out of "
            "range; the server's `databases` setting is lower)"
        ]

    def test_a_taken_http_port_exits_3(
        self, streams_server: RedisServer, pubsub_server: RedisServer
    ) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            env = worker_env(
                streams_server.url, pubsub_server.url, EVENT_ROUTER_HTTP_PORT=str(port)
            )
            done = _run_worker(env)

        assert done.returncode == 3, done.stderr
        assert "Traceback" not in done.stderr
        (line,) = _error_lines(done.stderr)
        assert line.startswith(
            f"error: cannot listen on 127.0.0.1:{port}: address already in use; "
            "set EVENT_ROUTER_HTTP_PORT to a free one, e.g. "
        ), line


class TestOrderAcrossWorkers:
    JOBS = 60

    async def test_back_to_back_events_of_a_job_reach_subscribers_in_order_with_two_workers(
        self, workers: Workers, subscriber: PubSubCollector, streams_redis: Redis
    ) -> None:
        routers = [await workers.start(), await workers.start()]
        jobs = [f"pair-{n}" for n in range(self.JOBS)]
        for job in jobs:
            # Written back to back: idle workers take new entries in turn, so the two events
            # of a job usually go to different workers.
            await add_event(streams_redis, job, 1, stage="queued")
            await add_event(streams_redis, job, 2, stage="vision")

        await eventually(lambda: len(subscriber.messages) >= 2 * self.JOBS, what="all published")
        stale = [
            await router.metric("event_router_events_total", verdict="stale") for router in routers
        ]

        assert {job: subscriber.seqs(job) for job in jobs} == {job: [1, 2] for job in jobs}
        assert stale == [0.0, 0.0]
