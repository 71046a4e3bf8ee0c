"""A `redis-server` child process: its binary, a free loopback port, readiness and stopping.

Shared by `serve --embedded-redis` and the throwaway servers of the tests and benchmarks.
"""

from __future__ import annotations

import shutil
import socket
import subprocess

LOOPBACK = "127.0.0.1"
# Where Debian and Ubuntu put the binaries, should PATH not include the sbin directories.
SEARCH_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/bin")


def find_binary(name: str) -> str | None:
    """The path of `name` on PATH or in `SEARCH_DIRS`, else None."""
    found = shutil.which(name)
    for directory in SEARCH_DIRS:
        found = found or shutil.which(name, path=directory)
    return found


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def answers_as(port: int, pid: int | None, *, timeout_s: float = 0.5) -> bool:
    """Whether the port answers PING and is the server of process `pid`, not a stranger's
    that bound the port between `free_port` and the child's bind."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
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
        return False  # -LOADING while a file is read back, or not ready yet
    fields = dict(
        line.split(":", 1) for line in reply.decode(errors="replace").splitlines() if ":" in line
    )
    return fields.get("process_id") == str(pid)


def stop_process(process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """SIGTERM (which lets Redis fsync its append-only file), SIGKILL after `timeout_s`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _has_line(reply: bytes, start: bytes) -> bool:
    at = reply.find(start)
    return at >= 0 and reply.find(b"\r\n", at) >= 0
