"""A router subprocess the benchmarks start: its command, environment, log, /proc figures, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Self

from prometheus_client.parser import text_string_to_metric_families

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent

READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.05


def eco_router_command(*args: str) -> list[str]:
    """`eco-router *args`: the script installed next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("eco-router")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "eco_router.entrypoints.cli", *args]


def eco_router_env(streams_url: str, pubsub_url: str, **settings: str) -> dict[str, str]:
    """This process's environment without its own eco-router settings, plus the given ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ROUTER_", "REDIS_"))}
    env.update(REDIS_STREAMS_URL=streams_url, REDIS_PUBSUB_URL=pubsub_url, **settings)
    return env


class RouterProcess:
    """A router subprocess logging to a temporary file; `figures` are set by stop().

    A context manager: leaving the block stops it.
    """

    # Exit codes that need no warning: a clean exit, or the SIGKILL after a slow stop.
    clean_exits: tuple[int, ...] = (0, -signal.SIGKILL)
    stop_timeout_s = 20.0

    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str],
        name: str,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.figures: dict[str, float] = {}
        self._log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            env=env,
            cwd=REPOSITORY_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def http_url(self) -> str | None:
        """Where the process serves HTTP (/ready, /metrics), or None while unknown or never."""
        return None

    def http_get(self, path: str, *, timeout: float) -> str | None:
        """The body of a 200 reply to GET `path`, or None if there was none."""
        base_url = self.http_url()
        if base_url is None:
            return None
        try:
            with urllib.request.urlopen(f"{base_url}{path}", timeout=timeout) as reply:
                return reply.read().decode() if reply.status == 200 else None
        except OSError:
            return None

    def router_figures(self) -> dict[str, float]:
        """The router's verdict counts, batch sizes and publishes from /metrics, or {}."""
        text = self.http_get("/metrics", timeout=5)
        if text is None:
            return {}
        figures: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "event_router_events_total":
                    verdict = sample.labels["verdict"]
                    figures[verdict] = figures.get(verdict, 0.0) + sample.value
                elif sample.name in (
                    "event_router_batch_size_sum",
                    "event_router_batch_size_count",
                ):
                    figures[sample.name.removeprefix("event_router_")] = sample.value
                elif sample.name == "event_router_published_total":
                    figures["published"] = figures.get("published", 0.0) + sample.value
        return figures

    def wait_ready(self) -> None:
        """Until /ready answers 200 (both Redis servers answer, the router runs)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            self.check_alive()
            if self.http_get("/ready", timeout=2) is not None:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} not ready in {READY_TIMEOUT_S}s\n{self.log_tail()}"
                )
            time.sleep(READY_POLL_S)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode}\n{self.log_tail()}"
            )

    def cpu_seconds(self) -> float:
        """User + system CPU of the process so far, from /proc."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        fields = stat.rpartition(")")[2].split()
        # After the command name: state is field 3, utime 14 and stime 15 (1-based).
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tcp_ports(self, state: str) -> set[int]:
        """Local ports of the process's TCP sockets in `state` (/proc/net/tcp: 0A listen,
        01 established)."""
        inodes = set()
        for fd in Path(f"/proc/{self.process.pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] == state and parts[9] in inodes:
                    ports.add(int(parts[1].rpartition(":")[2], 16))
        return ports

    def rss_kib(self) -> int:
        """VmRSS of the process, in KiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError(f"no VmRSS in /proc/{self.process.pid}/status")

    def stop(self) -> None:
        """SIGTERM (finish what is in flight and exit), SIGKILL if it takes too long."""
        if self.process.poll() is None:
            self._before_stop()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        if self.process.returncode not in self.clean_exits:
            print(f"warning: {self.name} exited with {self.process.returncode}\n{self.log_tail()}")
        self._after_stop()
        Path(self._log.name).unlink(missing_ok=True)

    def log_tail(self, lines: int = 20) -> str:
        if not self._log.closed:
            self._log.flush()
        text = Path(self._log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _before_stop(self) -> None:
        """Hook: collect what is only available while the router runs."""

    def _after_stop(self) -> None:
        """Hook: collect what the router reports on exit."""
