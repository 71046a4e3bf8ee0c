"""The reference design's gateway, as a baseline: one Pub/Sub subscription per SSE client.

A tiny Starlette app on uvicorn: each `GET /api/v1/{domain}/{job_id}/events` opens its own
Pub/Sub connection, subscribes the job's channel, writes a snapshot frame once Redis
confirmed the subscription (so the benchmark's client counts it established the same way),
then one `id/event/data` frame per message, a keepalive comment every 15 s, and ends after
`done` or a failed event. No history replay, no resume, no bounds: only the delivery path
the benchmark compares.

Run: `python -m bench.reference_gateway --port P --pubsub-url redis://127.0.0.1:N/0`.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
from collections.abc import AsyncIterator

import orjson
import uvicorn
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

KEEPALIVE_S = 15.0


def create_app(pubsub_url: str, channel_prefix: str) -> Starlette:
    redis = Redis.from_url(pubsub_url, max_connections=1_000_000)

    async def events(request: Request) -> StreamingResponse:
        job_id = request.path_params["job_id"]
        pubsub = redis.pubsub()
        await pubsub.subscribe(f"{channel_prefix}:{job_id}")
        # The subscription's confirmation: from now on every publish reaches this client.
        while await pubsub.get_message(timeout=5.0) is None:
            pass

        async def frames() -> AsyncIterator[bytes]:
            try:
                yield b'event: snapshot\ndata: {"job_id":"%s","state":null}\n\n' % job_id.encode()
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=KEEPALIVE_S
                    )
                    if message is None:
                        yield b": keepalive\n\n"
                        continue
                    data = message["data"]
                    event = orjson.loads(data)
                    stage, status = event.get("stage"), event.get("status")
                    name = "done" if "done" in (stage, status) else stage or "progress"
                    if status == "failed":
                        name = "error"
                    yield b"id: %d\nevent: %s\ndata: %s\n\n" % (event["seq"], name.encode(), data)
                    if name in ("done", "error"):
                        return
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

        return StreamingResponse(frames(), media_type="text/event-stream")

    async def ready(_: Request) -> PlainTextResponse:
        await redis.ping()
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/api/v1/{domain}/{job_id}/events", events),
            Route("/ready", ready),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reference_gateway")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pubsub-url", required=True)
    parser.add_argument("--channel-prefix", default="sse:events")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    app = create_app(args.pubsub_url, args.channel_prefix)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        loop="uvloop",
        timeout_graceful_shutdown=10,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
