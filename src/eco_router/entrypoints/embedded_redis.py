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
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.startup_checks import StartupFailure

HOST = "127.0.0.1"
# Where Debian and Ubuntu put it, should PATH not include the sbin directories.
_FALLBACK_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/bin")
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0
_PROBE_INTERVAL_S = 0.02
_BIND_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1


def redis_server_binary() -> str:
    """The `redis-server` on PATH or in the usual directories, else a one-line
    `StartupFailure` naming the package to install."""
    found = shutil.which("redis-server")
    for directory in _FALLBACK_DIRS:
        found = found or shutil.which("redis-server", path=directory)
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
            self._port = _free_port()
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
            if _answers_as(self._port, process.pid):
                return True
            time.sleep(_PROBE_INTERVAL_S)
        return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _answers_as(port: int, pid: int) -> bool:
    """Whether the port answers PING and is this process's server, not a stranger's that
    bound the port between `_free_port` and our bind."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\nINFO server\r\n")
            reply = b""
            while not _has_line(reply, b"process_id:"):
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                reply += chunk
    except OSError:
        return False
    if not reply.startswith(b"+PONG"):
        return False  # -LOADING, or not ready yet
    fields = dict(
        line.split(":", 1) for line in reply.decode(errors="replace").splitlines() if ":" in line
    )
    return fields.get("process_id") == str(pid)


def _has_line(reply: bytes, start: bytes) -> bool:
    at = reply.find(start)
    return at >= 0 and reply.find(b"\r\n", at) >= 0
