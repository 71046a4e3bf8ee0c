"""A chat job's worker, one call per run, for the TypeScript client's node tests:

    python -m tests.integration.typescript_producer STREAMS_URL JOB queued
    python -m tests.integration.typescript_producer STREAMS_URL JOB tokens ATTEMPT DELTA...
    python -m tests.integration.typescript_producer STREAMS_URL JOB done RESULT_JSON

It writes with the producer SDK, as a worker would, to the streams Redis of the `serve` that
tests/integration/test_typescript_client.py started.
"""

from __future__ import annotations

import json
import sys

from eco_router.producer import connect, producer_config


def main(argv: list[str]) -> None:
    url, job, action, *rest = argv
    publisher = connect(url, producer_config(domain="chat", shards=4))
    if action == "queued":
        publisher.publish_stage_event(job, "queued", "queued")
    elif action == "tokens":
        attempt, *deltas = rest
        publisher.publish_tokens(job, deltas, node="answer", attempt=int(attempt), coalesce_ms=0)
    elif action == "done":
        publisher.publish_stage_event(job, "done", "done", result=json.loads(rest[0]))
    else:
        raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
