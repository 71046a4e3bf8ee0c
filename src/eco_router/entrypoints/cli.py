"""The `eco-router` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Generator, Sequence

import uvicorn
from redis.exceptions import RedisError

from eco_router import __version__
from eco_router.adapters.redaction import redact_url
from eco_router.application.errors import PortError
from eco_router.domain.progress import InvalidProgressEvent, StagePlan, Status
from eco_router.entrypoints import event_loop
from eco_router.entrypoints import operator_commands as commands
from eco_router.entrypoints.container import build_container
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.http.app import create_app, end_streams
from eco_router.entrypoints.http.server_config import server_config
from eco_router.entrypoints.logging_setup import configure_logging
from eco_router.entrypoints.operator_commands import UsageError
from eco_router.entrypoints.settings import (
    ConfigError,
    Settings,
    load_settings,
    unknown_variables,
)
from eco_router.entrypoints.startup_checks import (
    StartupFailure,
    cause,
    check_redis_servers,
    listening_socket,
)
from eco_router.entrypoints.worker import serve

log = logging.getLogger("eco_router")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STAGES_HELP = (
    f"the domain's stage order, comma-separated (default: {','.join(StagePlan().stages)})"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve" and args.in_memory and args.no_router:
        # In-memory streams live in this process only: nothing else could route them.
        parser.error("serve: --no-router needs Redis, it cannot be combined with --in-memory")
    try:
        settings = load_settings()
    except ConfigError as error:
        for line in str(error).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return ExitCode.CONFIGURATION
    configure_logging(settings.log_level)
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    try:
        if args.command == "worker":
            return _worker(settings)
        if args.command == "serve":
            return _serve(
                settings,
                host=args.host,
                port=args.port,
                in_memory=args.in_memory,
                route=not args.no_router,
                demo=args.demo,
            )
        return _operator(settings, args)
    except StartupFailure as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except (UsageError, InvalidProgressEvent) as error:
        print(f"eco-router {args.command}: {error}", file=sys.stderr)
        return ExitCode.CONFIGURATION
    except (OSError, RuntimeError, RedisError, PortError) as error:
        log.error("%s", error)
        return ExitCode.ERROR


def _operator(settings: Settings, args: argparse.Namespace) -> int:
    try:
        code = asyncio.run(_operator_command(settings, args))
        # Flushed here, so a closed pipe is met below and not in Python's exit.
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader has gone (`eco-router dlq list | head -2`): stop quietly with the status
        # of a tool that SIGPIPE ended (128 + 13), as `git log | head` does. Pointing stdout
        # at /dev/null keeps Python's last flush from failing again (Python docs, "Note on
        # SIGPIPE").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.BROKEN_PIPE
    except (OSError, RedisError, PortError) as error:
        # The server answered at first (`streams_client`), then failed mid-command.
        print(f"error: eco-router {_command_name(args)}: {cause(error)}", file=sys.stderr)
        return ExitCode.ERROR
    return code


def _command_name(args: argparse.Namespace) -> str:
    return f"dlq {args.dlq_command}" if args.command == "dlq" else str(args.command)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eco-router",
        description="Routes job-progress events from Redis Streams to Pub/Sub.",
        epilog="Settings come from the environment (docs/CONFIGURATION.md). Exit status: 0 "
        "done or stopped cleanly; 1 an error, or `state` of an unknown job; 2 an invalid "
        "setting, argument or credentials, a Redis database the server lacks, or `dlq replay` "
        "ids that name no dead letter; 3 a Redis server or the port unavailable at startup; "
        "4 a router task kept failing (worker); 141 output closed early (e.g. `| head`).",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _command(
        commands,
        "worker",
        "run the router (lease keeper, consumer, reclaimer, shard observer) with /health, "
        "/ready, /metrics on EVENT_ROUTER_HTTP_HOST:EVENT_ROUTER_HTTP_PORT",
    )
    serve_cmd = _command(
        commands, "serve", "run the HTTP app (SSE gateway, demo page) with the router inside"
    )
    serve_cmd.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve_cmd.add_argument("--port", type=_port, default=8000, help="port to listen on")
    serve_cmd.add_argument(
        "--in-memory",
        action="store_true",
        help="use in-memory adapters instead of Redis (nothing is persisted)",
    )
    serve_cmd.add_argument(
        "--no-router",
        action="store_true",
        help="serve SSE only; `eco-router worker` processes route the events",
    )
    serve_cmd.add_argument(
        "--demo",
        action="store_true",
        help="let the page at / start demo jobs (POST /api/v1/demo/jobs)",
    )
    _add_operator_commands(commands)
    return parser


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default; flags (off unless given) and required options show none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action.default, bool) or action.default is None or action.required:
            return action.help
        return super()._get_help_string(action)


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str
) -> argparse.ArgumentParser:
    return commands.add_parser(
        name, help=summary, description=summary, formatter_class=_HelpFormatter
    )


def _add_operator_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    publish = _command(commands, "publish", "publish one job-progress event")
    publish.add_argument("--domain", default="scan", help="the stream family's domain")
    publish.add_argument("--job", required=True, help="the job id")
    publish.add_argument("--stage", required=True, help="the stage name, e.g. vision")
    publish.add_argument(
        "--status",
        required=True,
        choices=[s.value for s in Status if s is not Status.STREAMING],
        help="the stage's status (tokens: the producer SDK's publish_tokens)",
    )
    publish.add_argument("--result", help='a JSON value, e.g. \'{"label": "cat"}\'')
    publish.add_argument("--progress", type=int, help="percent done, 0-100")
    publish.add_argument("--seq", type=int, help="override the deterministic seq")
    publish.add_argument("--stages", help=_STAGES_HELP)

    demo = _command(commands, "demo", "simulate workers running whole pipelines")
    demo.add_argument("--domain", default="scan", help="the stream family's domain")
    demo.add_argument("--jobs", type=_positive_int, default=20, help="how many jobs to run")
    demo.add_argument("--rate", type=_positive_float, default=20.0, help="events per second")
    demo.add_argument("--stages", help=_STAGES_HELP)

    state = _command(commands, "state", "show a job's state snapshot and history")
    state.add_argument("job", help="the job id")
    state.add_argument("--domain", default="scan", help="the stream family's domain")
    state.add_argument("--json", action="store_true", dest="as_json", help="print JSON")

    dlq = _command(commands, "dlq", "inspect and replay dead letters")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")
    dlq_list = _command(dlq_commands, "list", "show dead letters, oldest first")
    dlq_list.add_argument("--domain", default="scan", help="the stream family's domain")
    dlq_list.add_argument(
        "--count", type=_positive_int, default=100, help="how many dead letters to show at most"
    )
    replay = _command(dlq_commands, "replay", "put dead letters back on their stream")
    replay.add_argument("ids", nargs="*", metavar="ID", help="dead-letter ids, as `dlq list` shows")
    replay.add_argument(
        "--all", action="store_true", dest="replay_all", help="replay every dead letter"
    )
    replay.add_argument("--domain", default="scan", help="the stream family's domain")

    status = _command(
        commands, "status", "show the live routers and each shard's holder, lag and pending"
    )
    status.add_argument("--json", action="store_true", dest="as_json", help="print JSON")


async def _operator_command(settings: Settings, args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.command == "publish":
        return await commands.publish(
            settings,
            domain=args.domain,
            job=args.job,
            stage=args.stage,
            status=args.status,
            result=args.result,
            progress=args.progress,
            seq=args.seq,
            stages=args.stages,
            out=out,
        )
    if args.command == "demo":
        return await commands.demo(
            settings,
            domain=args.domain,
            jobs=args.jobs,
            rate=args.rate,
            stages=args.stages,
            out=out,
        )
    if args.command == "state":
        return await commands.state(
            settings, domain=args.domain, job=args.job, as_json=args.as_json, out=out
        )
    if args.command == "status":
        return await commands.status(settings, as_json=args.as_json, out=out)
    if args.dlq_command == "list":
        return await commands.dlq_list(settings, domain=args.domain, count=args.count, out=out)
    return await commands.dlq_replay(
        settings, domain=args.domain, ids=args.ids, replay_all=args.replay_all, out=out
    )


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65_535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


def _worker(settings: Settings) -> int:
    log_start("worker", settings)
    container = build_container(settings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await check_redis_servers(settings)
        await serve(container, stop)

    event_loop.run(run(), settings.event_loop)
    log.info("worker stopped")
    return ExitCode.OK


def _serve(
    settings: Settings, *, host: str, port: int, in_memory: bool, route: bool, demo: bool
) -> int:
    sock = listening_socket(host, port)
    try:
        return _serve_on(sock, settings, host=host, in_memory=in_memory, route=route, demo=demo)
    finally:
        sock.close()


def _serve_on(
    sock: socket.socket,
    settings: Settings,
    *,
    host: str,
    in_memory: bool,
    route: bool,
    demo: bool,
) -> int:
    if in_memory:
        log.warning("running on in-memory adapters: no Redis is used and nothing is persisted")
    else:
        log_start("serve", settings)
        asyncio.run(check_redis_servers(settings))
    if not route:
        log.info("serving SSE only: events are routed by eco-router worker processes")
    container = build_container(settings, in_memory=in_memory, route=route)
    app = create_app(container, route=route, demo=demo)
    port = int(sock.getsockname()[1])
    if settings.console:
        log.info(
            "open http://%s:%d/ in a browser; the operator console is at http://%s:%d/console",
            host,
            port,
            host,
            port,
        )
    else:
        log.info("open http://%s:%d/ in a browser", host, port)
    config = server_config(app, settings, host=host, port=port)
    server = _GatewayServer(config, before_shutdown=lambda: end_streams(app))
    server.run(sockets=[sock])
    # uvicorn has logged why it could not start.
    return ExitCode.OK if server.started else ExitCode.UNREACHABLE


class _GatewayServer(uvicorn.Server):
    """uvicorn that ends with exit status 0 after a graceful shutdown on SIGTERM or SIGINT.

    uvicorn's own handlers re-raise the signal once it has shut down, so the process would die
    of it (status 143 for SIGTERM) after draining; the worker exits 0, and so should this.
    Open SSE streams are ended as the shutdown begins (`before_shutdown`), once no new
    connection is accepted.
    """

    def __init__(
        self, config: uvicorn.Config, *, before_shutdown: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        await self._before_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                if handler is not None:
                    signal.signal(sig, handler)


def log_start(command: str, settings: Settings) -> None:
    log.info(
        "%s: streams %s, pubsub %s, families %s, group %s, consumer %s",
        command,
        redact_url(settings.redis_streams_url),
        redact_url(settings.pubsub_url),
        ",".join(f"{f.prefix}={f.shards}" for f in settings.streams),
        settings.consumer_group,
        settings.consumer_name,
    )
    if settings.order_wait_ms is not None:
        log.warning(
            "EVENT_ROUTER_ORDER_WAIT_MS is no longer used: each shard has one holder at a "
            "time (leases), which keeps every job's events in stream order"
        )


if __name__ == "__main__":
    sys.exit(main())
