"""`/ready` after Redis comes back: an `eco-router worker` subprocess on the documented
defaults (one Redis server for streams and Pub/Sub), only its addresses and port set."""

from __future__ import annotations

import os
import time
from pathlib import Path

from eco_router.testing import RedisServer
from tests.integration.support import WorkerProcess, eventually

# The reclaimer first runs a minute after the start (EVENT_ROUTER_RECLAIM_INTERVAL_S).
RECLAIMER_FIRST_PASS_S = 60.0
# Every loop retries with a back-off of at most 5 s; one interval (60 s) is the bug.
READY_AGAIN_WITHIN_S = 15.0


def default_env(redis_url: str) -> dict[str, str]:
    """The documented defaults: only the Redis server's address and the HTTP port set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVENT_ROUTER_", "REDIS_")) and k != "POD_NAME"
    }
    env.update(
        REDIS_STREAMS_URL=redis_url,
        EVENT_ROUTER_HTTP_HOST="127.0.0.1",
        EVENT_ROUTER_HTTP_PORT="0",
    )
    return env


class TestReadyAgainAfterAnOutage:
    async def test_a_reclaimer_pass_failed_during_the_outage_is_retried_once_redis_answers(
        self, streams_server: RedisServer, tmp_path: Path
    ) -> None:
        worker = WorkerProcess.spawn(default_env(streams_server.url), tmp_path / "worker.log")
        try:
            await worker.until_ready()
            await eventually(
                lambda: _status_is(worker, 200), timeout_s=30, what="/ready answers 200"
            )

            streams_server.stop()
            # Down across the reclaimer's first pass, which fails.
            body = await eventually(
                lambda: _failing(worker, "reclaimer"),
                timeout_s=RECLAIMER_FIRST_PASS_S + 20,
                what="the reclaimer failing",
            )
            assert body["ready"] is False
            streams_server.start()
            back = time.monotonic()
            await eventually(
                lambda: _status_is(worker, 200),
                timeout_s=READY_AGAIN_WITHIN_S,
                what="/ready answers 200 again",
            )
            took_s = time.monotonic() - back
        finally:
            worker.terminate()
            code = await worker.wait_exit()

        assert took_s < READY_AGAIN_WITHIN_S
        assert code == 0, worker.log_tail()
        log = worker.log()
        # One warning for the episode, however often it was retried.
        assert log.count("reclaimer: transient failure") == 1, worker.log_tail()
        assert "reclaimer: working again" in log


async def _status_is(worker: WorkerProcess, status: int) -> bool:
    return (await worker.get("/ready")).status_code == status


async def _failing(worker: WorkerProcess, check: str) -> dict[str, object] | None:
    body = (await worker.get("/ready")).json()
    return body if body["checks"].get(check, "ok") != "ok" else None
