"""The `eco-router` command.

Only the argument parser is imported at start: each command imports what it needs when it
runs (the web stack for `serve` and `worker`, Redis for the operator commands, JWT for
`token`), so `--version`, `--help` and the operator commands start quickly. Those imports
run with the garbage collector paused, and the exit does not collect (`gc_tuning`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from eco_router import __version__
from eco_router.domain.parsing import JOB_ID_PATTERN
from eco_router.domain.progress import StagePlan, Status
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.gc_tuning import no_collection_at_exit, start_up_uncollected
from eco_router.entrypoints.startup_log import log_start

if TYPE_CHECKING:
    from eco_router.entrypoints.discovery import ServerChoice
    from eco_router.entrypoints.operator_commands import Server
    from eco_router.entrypoints.settings import Settings

__all__ = ["log_start", "main"]

log = logging.getLogger("eco_router")

_STAGES_HELP = (
    f"the domain's stage order, comma-separated (default: {','.join(StagePlan().stages)})"
)
_OPERATOR_COMMANDS = frozenset({"publish", "demo", "state", "dlq", "status"})


def main(argv: Sequence[str] | None = None) -> int:
    no_collection_at_exit()
    args = _parser().parse_args(argv)
    if args.command == "serve":
        if args.in_memory and args.no_router:
            # In-memory streams live in this process only: nothing else could route them.
            args.command_parser.error(
                "--no-router needs Redis, it cannot be combined with --in-memory"
            )
        if args.in_memory and args.embedded_redis:
            args.command_parser.error(
                "--embedded-redis and --in-memory are two ways to run without a Redis of "
                "your own: choose one"
            )
    if args.command == "token":
        return _token(args)
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 128 + 2


def _run(args: argparse.Namespace) -> int:
    with start_up_uncollected():
        from redis.exceptions import RedisError

        from eco_router.application.errors import PortError
        from eco_router.domain.progress import InvalidProgressEvent
        from eco_router.entrypoints.discovery import InMemoryServeOnly
        from eco_router.entrypoints.operator_commands import UsageError
        from eco_router.entrypoints.startup_checks import StartupFailure

    choice = None
    try:
        if args.command in _OPERATOR_COMMANDS:
            choice = _server_choice()
        settings = _settings(choice)
        if settings is None:
            return ExitCode.CONFIGURATION
        if args.command == "worker":
            from eco_router.entrypoints.serve_command import run_worker

            return run_worker(settings)
        if args.command == "serve":
            from eco_router.entrypoints.serve_command import run_serve

            return run_serve(
                settings,
                host=args.host,
                port=args.port,
                in_memory=args.in_memory,
                embedded_redis=args.embedded_redis,
                route=not args.no_router,
                demo=args.demo,
            )
        assert choice is not None
        return _operator(settings, args, _server(settings, choice))
    except InMemoryServeOnly as error:
        print(f"eco-router {_command_name(args)}: {error}", file=sys.stderr)
        return ExitCode.UNREACHABLE
    except StartupFailure as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except (UsageError, InvalidProgressEvent) as error:
        print(f"eco-router {args.command}: {error}", file=sys.stderr)
        return ExitCode.CONFIGURATION
    except (OSError, RuntimeError, RedisError, PortError) as error:
        log.error("%s", error)
        return ExitCode.ERROR


def _server_choice() -> ServerChoice:
    """The server the operator commands talk to: the environment's, or a running
    `serve --embedded-redis`'s."""
    from eco_router.entrypoints.discovery import choose_server, discovery_dir, live_records

    return choose_server(os.environ, live_records(discovery_dir()))


def _settings(choice: ServerChoice | None) -> Settings | None:
    """The settings, logging configured; None once the configuration errors are printed."""
    from eco_router.entrypoints.logging_setup import configure_logging
    from eco_router.entrypoints.settings import ConfigError, load_settings, unknown_variables

    overrides: dict[str, object] = {}
    if choice is not None and choice.discovered:
        overrides = {"redis_streams_url": choice.streams_url, "redis_pubsub_url": choice.pubsub_url}
    try:
        settings = load_settings(**overrides)
    except ConfigError as error:
        for line in str(error).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return None
    configure_logging(settings.log_level)
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    return settings


def _server(settings: Settings, choice: ServerChoice) -> Server:
    from eco_router.adapters.redaction import redact_url
    from eco_router.entrypoints.operator_commands import Server

    return Server(url=redact_url(settings.redis_streams_url), via=choice.via)


def _token(args: argparse.Namespace) -> int:
    with start_up_uncollected():
        from eco_router.entrypoints.token_command import TokenRefused, mint

    settings = _settings(None)
    if settings is None:
        return ExitCode.CONFIGURATION
    try:
        token = mint(
            settings,
            jobs=args.jobs,
            domain=args.domain,
            admin=args.admin,
            ttl_s=args.ttl,
        )
    except TokenRefused as error:
        print(f"eco-router token: {error}", file=sys.stderr)
        return error.exit_code
    print(token)
    return ExitCode.OK


def _operator(settings: Settings, args: argparse.Namespace, server: Server) -> int:
    import asyncio

    from redis.exceptions import RedisError

    from eco_router.application.errors import PortError
    from eco_router.entrypoints.startup_checks import cause

    try:
        code = asyncio.run(_operator_command(settings, args, server))
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


class _Parser(argparse.ArgumentParser):
    """A parser whose errors are one line, `eco-router publish: error: ...`, with a pointer to
    --help instead of the whole usage block; its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            ExitCode.CONFIGURATION, f"{self.prog}: error: {message} (see {self.prog} --help)\n"
        )


def _parser() -> _Parser:
    parser = _Parser(
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
        help="use in-memory adapters instead of Redis (nothing is persisted; the operator "
        "commands cannot reach them)",
    )
    serve_cmd.add_argument(
        "--embedded-redis",
        action="store_true",
        help="start a private redis-server (loopback, nothing persisted, stopped with serve) "
        "as both servers; the operator commands in another terminal find it",
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
    _add_token_command(commands)
    return parser


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default; flags (off unless given) and required options show none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action.default, bool) or action.default is None or action.required:
            return action.help
        return super()._get_help_string(action)


def _command(commands: argparse._SubParsersAction[_Parser], name: str, summary: str) -> _Parser:
    parser = commands.add_parser(
        name, help=summary, description=summary, formatter_class=_HelpFormatter
    )
    # Lets a check made after parsing report as this command's own error.
    parser.set_defaults(command_parser=parser)
    return parser


def _add_operator_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
    publish = _command(commands, "publish", "publish one job-progress event")
    publish.add_argument("--domain", default="scan", help="the stream family's domain")
    publish.add_argument("--job", required=True, type=_job_id, help="the job id")
    publish.add_argument("--stage", required=True, help="the stage name, e.g. vision")
    publish.add_argument(
        "--status",
        required=True,
        choices=[s.value for s in Status if s is not Status.STREAMING],
        help="the stage's status (tokens: the producer SDK's publish_tokens)",
    )
    publish.add_argument("--result", help='a JSON value, e.g. \'{"label": "cat"}\'')
    publish.add_argument("--progress", type=_integer, help="percent done, 0-100")
    publish.add_argument("--seq", type=_integer, help="override the deterministic seq")
    publish.add_argument("--stages", help=_STAGES_HELP)

    demo = _command(commands, "demo", "simulate workers running whole pipelines")
    demo.add_argument("--domain", default="scan", help="the stream family's domain")
    demo.add_argument("--jobs", type=_positive_int, default=20, help="how many jobs to run")
    demo.add_argument("--rate", type=_positive_float, default=20.0, help="events per second")
    demo.add_argument("--stages", help=_STAGES_HELP)

    state = _command(commands, "state", "show a job's state snapshot and history")
    state.add_argument("job", type=_job_id, help="the job id")
    state.add_argument("--domain", default="scan", help="the stream family's domain")
    state.add_argument("--json", action="store_true", dest="as_json", help="print JSON")

    dlq = _command(commands, "dlq", "inspect and replay dead letters")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")
    dlq_list = _command(dlq_commands, "list", "show dead letters, oldest first")
    dlq_list.add_argument(
        "--domain", default=None, help="one stream family's domain (default: every one)"
    )
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


def _add_token_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    token = _command(
        commands,
        "token",
        "print a token signed with EVENT_ROUTER_JWT_SECRET: a viewer's (the SSE streams of "
        "--job, or of every job of --domain) or, with --admin, the console's",
    )
    token.add_argument(
        "--job",
        action="append",
        dest="jobs",
        type=_job_id,
        default=[],
        metavar="ID",
        help="a job the token opens (repeat for more); without it, every job of --domain",
    )
    token.add_argument(
        "--domain",
        help="the jobs' domain, or * for every domain (default: scan)",
    )
    token.add_argument("--admin", action="store_true", help="an admin token, for the console")
    token.add_argument(
        "--ttl", type=_positive_int, default=3600, help="seconds until the token expires"
    )


async def _operator_command(settings: Settings, args: argparse.Namespace, server: Server) -> int:
    from eco_router.entrypoints import operator_commands as commands

    out = sys.stdout
    if args.command == "publish":
        return await commands.publish(
            settings,
            server,
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
            server,
            domain=args.domain,
            jobs=args.jobs,
            rate=args.rate,
            stages=args.stages,
            out=out,
        )
    if args.command == "state":
        return await commands.state(
            settings, server, domain=args.domain, job=args.job, as_json=args.as_json, out=out
        )
    if args.command == "status":
        return await commands.status(settings, server, as_json=args.as_json, out=out)
    if args.dlq_command == "list":
        return await commands.dlq_list(
            settings, server, domain=args.domain, count=args.count, out=out
        )
    return await commands.dlq_replay(
        settings, server, domain=args.domain, ids=args.ids, replay_all=args.replay_all, out=out
    )


def _job_id(text: str) -> str:
    """A job id as the producer accepts it (the same message as the producer's)."""
    if JOB_ID_PATTERN.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"job_id {text!r} must be 1-128 characters of [A-Za-z0-9_.:-]"
        )
    return text


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


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


if __name__ == "__main__":
    sys.exit(main())
