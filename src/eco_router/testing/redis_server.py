"""A throwaway ``redis-server`` process on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
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

_HOST = LOOPBACK
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 10.0
_PROBE_INTERVAL = 0.02
_LOG_TAIL_LINES = 20


def redis_server_binary() -> str:
    """Return the path of the ``redis-server`` executable or raise RuntimeError."""
    return _binary("redis-server", package="redis-server")


def redis_cli_binary() -> str:
    """Return the path of the ``redis-cli`` executable or raise RuntimeError."""
    return _binary("redis-cli", package="redis-tools")


def _binary(name: str, *, package: str) -> str:
    found = find_binary(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's {package} package")
    return found


class RedisServer:
    """A ``redis-server`` child process with its own port, data directory and log file."""

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        config: str = "",
        sentinel: bool = False,
    ) -> None:
        """``config`` is written to a config file on first start and kept across restarts,
        since the server may rewrite it (Sentinel does; CONFIG REWRITE does). ``sentinel``
        runs the process as a Redis Sentinel; its directives go in ``config``."""
        self._port = port if port is not None else free_port()
        self._appendonly = appendonly
        self._extra_args = tuple(extra_args)
        self._config = config
        self._sentinel = sentinel
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        """The loopback TCP port the server listens on."""
        return self._port

    @property
    def url(self) -> str:
        """A redis-py URL for database 0 of this server."""
        return f"redis://{_HOST}:{self._port}/0"

    @property
    def pid(self) -> int | None:
        """The process id while the process exists, else None."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def data_dir(self) -> Path | None:
        """The server's private working directory, created on first start."""
        return self._dir

    def start(self) -> None:
        """Launch the server and block until it answers PING; no-op if already running."""
        if self.running:
            return
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"redis-{self._port}-"))
        args = [
            redis_server_binary(),
            *self._config_file_args(self._dir),
            "--port", str(self._port),
            "--bind", _HOST,
            "--dir", str(self._dir),
            "--save", "",
            "--appendonly", "yes" if self._appendonly else "no",
            "--protected-mode", "no",
            "--logfile", str(self._dir / "redis.log"),
            "--daemonize", "no",
            *self._extra_args,
        ]  # fmt: skip
        # Errors raised before the logfile is opened (bad arguments) only reach the console.
        with (self._dir / "console.log").open("ab") as console:
            self._process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT
            )
        self._wait_until_ready()

    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """Shut down with SIGTERM, falling back to SIGKILL after ``timeout``; idempotent."""
        process, self._process = self._process, None
        # SIGTERM lets Redis fsync the AOF, which is what makes restart() keep data.
        stop_process(process, timeout)

    def kill(self) -> None:
        """Kill the process with SIGKILL, as a crash would, without a clean shutdown."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait()

    def restart(self) -> None:
        """Stop, then start again on the same port and data directory."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        """Stop the server and delete its data directory; a later start gets a fresh one."""
        self.stop()
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
        self.cleanup()

    def __repr__(self) -> str:
        return f"RedisServer(port={self._port}, pid={self.pid}, running={self.running})"

    def _config_file_args(self, data_dir: Path) -> list[str]:
        """The config file and mode arguments that must precede every other option."""
        if not self._config and not self._sentinel:
            return []
        path = data_dir / "redis.conf"
        if not path.exists():
            path.write_text(self._config)
        return [str(path), "--sentinel"] if self._sentinel else [str(path)]

    def _wait_until_ready(self) -> None:
        """Poll until this process answers PING, or stop it and raise RuntimeError."""
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                self._process = None
                raise RuntimeError(f"redis-server exited during startup\n{self.log_tail()}")
            if answers_as(self._port, self.pid):
                return
            time.sleep(_PROBE_INTERVAL)
        self.stop()
        raise RuntimeError(
            f"redis-server did not answer PING within {_START_TIMEOUT:.0f}s\n{self.log_tail()}"
        )

    def log_tail(self) -> str:
        """The last lines of the console output and the server log, for error messages."""
        if self._dir is None:
            return ""
        sections = []
        for name in ("console.log", "redis.log"):
            path = self._dir / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
                sections.append(f"--- {path} ---\n" + "\n".join(lines))
        return "\n".join(sections)
