"""A job's worker as a process, for the control tests: it reads its job's control messages
with the producer SDK and prints each as a JSON line.

    python -m tests.integration.control_job_worker STREAMS_URL JOB_ID (ack|hold)

`ack` acknowledges each message; a cancel ends the job with `done` / `cancelled`. `hold`
acknowledges nothing (a worker that dies before it does).
"""

from __future__ import annotations

import json
import sys

from eco_router.producer import ControlKind, connect, producer_config


def main(url: str, job_id: str, mode: str) -> int:
    publisher = connect(url, producer_config(domain="chat", shards=4))
    print(json.dumps({"ready": True}), flush=True)
    for message in publisher.control_messages(job_id):
        print(
            json.dumps(
                {
                    "kind": message.kind.value,
                    "request_id": message.request_id,
                    "body": dict(message.body),
                    "deliveries": message.deliveries,
                    "cancelled": publisher.cancelled(job_id),
                }
            ),
            flush=True,
        )
        if mode != "ack":
            continue
        if message.kind is ControlKind.CANCEL:
            publisher.publish_stage_event(job_id, "done", "cancelled", result={"stopped": True})
        publisher.acknowledge(message)
    print(json.dumps({"ended": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
