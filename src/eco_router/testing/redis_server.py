"""A throwaway ``redis-server`` process on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

_HOST = "127.0.0.1"
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 10.0
_PROBE_INTERVAL = 0.02
_LOG_TAIL_LINES = 20
_FALLBACK_DIRS = ("/usr/bin", "/usr/sbin")


def redis_server_binary() -> str:
    """Return the path of the ``redis-server`` executable or raise RuntimeError."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    for directory in _FALLBACK_DIRS:
        found = shutil.which("redis-server", path=directory)
        if found is not None:
            return found
    raise RuntimeError("redis-server not found: install Debian's redis-server package")


def _free_port() -> int:
    """Return a loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _command(*args: str) -> bytes:
    """Encode one command in RESP."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def _read_reply(sock: socket.socket) -> bytes:
    """Read one simple-string, error or bulk-string reply and return its payload."""
    buf = b""
    while b"\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("connection closed mid-reply")
        buf += chunk
    header, _, rest = buf.partition(b"\r\n")
    if not header.startswith(b"$"):
        return header
    length = int(header[1:])
    while len(rest) < length + 2:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed mid-reply")
        rest += chunk
    return rest[:length]


class RedisServer:
    """A ``redis-server`` child process with its own port, data directory and log file."""

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._port = port if port is not None else _free_port()
        self._appendonly = appendonly
        self._extra_args = tuple(extra_args)
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
        if process is None or process.poll() is not None:
            return
        # SIGTERM lets Redis fsync the AOF, which is what makes restart() keep data.
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

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

    def _wait_until_ready(self) -> None:
        """Poll until this process answers PING, or stop it and raise RuntimeError."""
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                self._process = None
                raise RuntimeError(f"redis-server exited during startup\n{self._log_tail()}")
            if self._answers_ping():
                return
            time.sleep(_PROBE_INTERVAL)
        self.stop()
        raise RuntimeError(
            f"redis-server did not answer PING within {_START_TIMEOUT:.0f}s\n{self._log_tail()}"
        )

    def _answers_ping(self) -> bool:
        """Whether the port answers PING and belongs to our process, not a stranger."""
        try:
            with socket.create_connection((_HOST, self._port), timeout=0.5) as sock:
                sock.sendall(_command("PING"))
                # -LOADING while an AOF replays: not ready yet.
                if not _read_reply(sock).startswith(b"+PONG"):
                    return False
                sock.sendall(_command("INFO", "server"))
                info = _read_reply(sock)
        except OSError:
            return False
        # Another process may have grabbed the port between _free_port() and our bind.
        return f"process_id:{self.pid}\r\n".encode() in info

    def _log_tail(self) -> str:
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
