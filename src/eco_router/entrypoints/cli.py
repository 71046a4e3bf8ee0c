"""The `eco-router` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import uvicorn

from eco_router.adapters.redis.connection import redacted
from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.http.app import create_app
from eco_router.entrypoints.logging_setup import configure_logging
from eco_router.entrypoints.settings import ConfigError, Settings, load_settings
from eco_router.entrypoints.worker import serve

log = logging.getLogger("eco_router")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as error:
        print(f"eco-router: {error}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        if args.command == "worker":
            return _worker(settings)
        return _serve(settings, host=args.host, port=args.port, in_memory=args.in_memory)
    except (OSError, RuntimeError) as error:
        log.error("%s", error)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eco-router", description="Routes job-progress events from Redis Streams to Pub/Sub."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "worker", help="run the router (consumer + reclaimer) with /health, /ready, /metrics"
    )
    serve_cmd = commands.add_parser("serve", help="run the HTTP app with the router inside")
    serve_cmd.add_argument("--host", default="127.0.0.1")
    serve_cmd.add_argument("--port", type=_port, default=8000)
    serve_cmd.add_argument(
        "--in-memory",
        action="store_true",
        help="use in-memory adapters instead of Redis (nothing is persisted)",
    )
    return parser


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65_535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


def _worker(settings: Settings) -> int:
    _log_start("worker", settings)
    container = build_container(settings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(container, stop)

    asyncio.run(run())
    log.info("worker stopped")
    return 0


def _serve(settings: Settings, *, host: str, port: int, in_memory: bool) -> int:
    if in_memory:
        log.warning("running on in-memory adapters: no Redis is used and nothing is persisted")
    else:
        _log_start("serve", settings)
    app = create_app(build_container(settings, in_memory=in_memory))
    uvicorn.run(app, host=host, port=port, log_level=settings.log_level.lower())
    return 0


def _log_start(command: str, settings: Settings) -> None:
    log.info(
        "%s: streams %s, pubsub %s, families %s, group %s, consumer %s",
        command,
        redacted(settings.redis_streams_url),
        redacted(settings.pubsub_url),
        ",".join(f"{f.prefix}={f.shards}" for f in settings.streams),
        settings.consumer_group,
        settings.consumer_name,
    )


if __name__ == "__main__":
    sys.exit(main())
