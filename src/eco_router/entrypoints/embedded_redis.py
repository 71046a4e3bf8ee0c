"""A private `redis-server` child for `serve --embedded-redis`: loopback only, nothing saved.

It runs in its own process group, so a Ctrl-C in the terminal reaches serve alone, which
stops it last, once the routers and the streams are done with it. On Linux it is also
asked to die with its parent (`PR_SET_PDEATHSIG`), so even a serve killed with SIGKILL
leaves no Redis behind.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from eco_router.adapters.redis.connections.server_process import (
    LOOPBACK,
    answers_as,
    find_binary,
    free_port,
    stop_process,
)
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.startup_checks import StartupFailure

HOST = LOOPBACK
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0
_PROBE_INTERVAL_S = 0.02
_BIND_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1


def redis_server_binary() -> str:
    """The `redis-server` on PATH or in the usual directories, else a one-line
    `StartupFailure` naming the package to install."""
    found = find_binary("redis-server")
    if found is None:
        raise StartupFailure(
            "--embedded-redis needs redis-server, found neither on PATH nor in /usr/sbin: "
            "install the redis-server package (apt-get install redis-server; "
            "brew install redis on macOS), or give REDIS_STREAMS_URL without --embedded-redis",
            ExitCode.UNREACHABLE,
        )
    return found


class EmbeddedRedis:
    """One `redis-server` on a free loopback port, with persistence off, until `stop()`."""

    def __init__(self, binary: str | None = None) -> None:
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._port = 0

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._port}/0"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the server and return once it answers PING, or raise `StartupFailure`."""
        binary = self._binary or redis_server_binary()
        self._dir = Path(tempfile.mkdtemp(prefix="eco-router-redis-"))
        for _ in range(_BIND_ATTEMPTS):
            self._port = free_port()
            self._process = self._spawn(binary, self._dir)
            if self._wait_until_ready(self._process):
                return
            self._terminate()  # another process took the port first: try another
        tail = self._log_tail()
        self.stop()
        raise StartupFailure(f"the embedded redis-server did not start{tail}", ExitCode.UNREACHABLE)

    def stop(self) -> None:
        """Shut the server down (SIGTERM, then SIGKILL after 10 s) and delete its directory;
        idempotent."""
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, binary: str, directory: Path) -> subprocess.Popen[bytes]:
        args = [
            binary,
            "--port", str(self._port),
            "--bind", HOST,
            "--dir", str(directory),
            "--save", "",
            "--appendonly", "no",
            "--logfile", str(directory / "redis.log"),
            "--daemonize", "no",
        ]  # fmt: skip
        with (directory / "console.log").open("ab") as console:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def _wait_until_ready(self, process: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            if answers_as(self._port, process.pid):
                return True
            time.sleep(_PROBE_INTERVAL_S)
        return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        stop_process(process, _STOP_TIMEOUT_S)

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        lines: list[str] = []
        for name in ("console.log", "redis.log"):
            path = self._dir / name
            if path.exists():
                lines += path.read_text(errors="replace").strip().splitlines()[-1:]
        return f": {lines[-1]}" if lines else ""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
