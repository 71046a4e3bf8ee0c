"""The processes a gateway benchmark runs against: fresh redis-servers (streams, Pub/Sub), an
`eco-router worker` routing between them, and the gateway measured, with the open files it
needs."""

from __future__ import annotations

import re
import resource
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.baseline_source import BaselineSource
from bench.redis_servers import redis_servers
from bench.router_process import RouterProcess, eco_router_command, eco_router_env
from eco_router.testing import RedisServer

DOMAIN = "scan"
SHARDS = 4
FD_HEADROOM = 200
GC_LINE = re.compile(r"gc pause: generation (\d) ([0-9.]+) ms")


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE to at least `needed` (children inherit it); the limits now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft >= needed:
        return soft, hard
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
        except (ValueError, OSError) as error:
            raise SystemExit(
                f"need {needed} file descriptors but the hard limit is {hard} ({error}); "
                "raise it (ulimit -Hn) or lower --connections"
            ) from None
    else:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def gateway_fds(max_connections: int) -> int:
    """Enough open files that `serve` keeps its connection cap (it lowers the cap to fit, with
    a warning)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * max_connections + 10_000
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def open_files_for(connections: int) -> int:
    """The connection cap for a gateway that must hold `connections` streams, with this
    process's open files limit raised so that the gateway (and the client here) can reach it."""
    fds = connections + FD_HEADROOM
    raise_fd_limit(gateway_fds(fds))
    return fds


@dataclass(frozen=True, slots=True)
class Column:
    """One gateway the table compares."""

    title: str
    reference: bool = False
    source: BaselineSource | None = None


class Gateway(RouterProcess):
    """A gateway process on a free loopback port: `serve --no-router`, or the reference."""

    clean_exits = (0, -signal.SIGTERM, -signal.SIGKILL)
    stop_timeout_s = 15.0

    def __init__(
        self,
        column: Column,
        streams_url: str,
        pubsub_url: str,
        *,
        fds: int,
        profile_to: Path | None = None,
    ) -> None:
        self.port = free_port()
        env = eco_router_env(
            streams_url,
            pubsub_url,
            EVENT_ROUTER_STREAMS=f"{DOMAIN}:events={SHARDS}",
            EVENT_ROUTER_LOG_LEVEL="DEBUG",
            EVENT_ROUTER_GATEWAY_METRICS="true",
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS=str(fds),
            EVENT_ROUTER_SSE_MAX_PER_CLIENT="100000",
            # Every client is this process: no cap per address (it must be 0 or above the
            # stream cap).
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT="0",
        )
        serve = ["serve", "--no-router", "--host", "127.0.0.1", "--port", str(self.port)]
        if column.reference:
            command = [sys.executable, "-m", "bench.reference_gateway", "--port", str(self.port)]
            command += ["--pubsub-url", pubsub_url]
        else:
            command = eco_router_command(*serve)
        if column.source is not None:
            env["PYTHONPATH"] = column.source.pythonpath()
            command = [column.source.python, "-m", "eco_router.entrypoints.cli", *command[1:]]
        if profile_to is not None and not column.reference:
            # cProfile writes its figures when the process exits (after SIGTERM's clean stop).
            python = column.source.python if column.source is not None else sys.executable
            command = [python, "-m", "cProfile", "-o", str(profile_to)]
            command += ["-m", "eco_router.entrypoints.cli", *serve]

        def limit_fds() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (gateway_fds(fds), gateway_fds(fds)))

        super().__init__(command, env=env, name="gateway", preexec_fn=limit_fds)

    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def gc_pauses_ms(self) -> list[float]:
        """Full (generation 2) collections the gateway logged, in ms."""
        if not self._log.closed:
            self._log.flush()
        text = Path(self._log.name).read_text(errors="replace")
        return [float(m[2]) for m in GC_LINE.finditer(text) if m[1] == "2"]


class Worker(RouterProcess):
    """`eco-router worker` of this tree: routes the producer's events to Pub/Sub."""

    def __init__(self, streams_url: str, pubsub_url: str) -> None:
        env = eco_router_env(
            streams_url,
            pubsub_url,
            EVENT_ROUTER_STREAMS=f"{DOMAIN}:events={SHARDS}",
            EVENT_ROUTER_CONSUMER_NAME="bench-worker",
            EVENT_ROUTER_HTTP_HOST="127.0.0.1",
            EVENT_ROUTER_HTTP_PORT=str(free_port()),
            EVENT_ROUTER_LOG_LEVEL="WARNING",
        )
        self._port = env["EVENT_ROUTER_HTTP_PORT"]
        super().__init__(eco_router_command("worker"), env=env, name="worker")

    def http_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"


@contextmanager
def routed_servers(connections: int) -> Iterator[tuple[RedisServer, RedisServer]]:
    """Fresh (streams, Pub/Sub) servers with a ready worker routing between them; all removed
    on the way out."""
    # The reference holds one Pub/Sub connection per client.
    pubsub_args = ("--maxclients", str(connections + 4_000))
    with (
        redis_servers(pubsub_args) as (streams, pubsub),
        Worker(streams.url, pubsub.url) as worker,
    ):
        worker.wait_ready()
        yield streams, pubsub


@contextmanager
def ready_gateway(
    column: Column, streams: RedisServer, pubsub: RedisServer, *, fds: int
) -> Iterator[Gateway]:
    """A gateway of `column` on those servers, once it answers /ready; stopped on the way out."""
    with Gateway(column, streams.url, pubsub.url, fds=fds) as gateway:
        gateway.wait_ready()
        yield gateway
