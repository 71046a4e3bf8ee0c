"""How the operator commands find the Redis of a `serve` running in another terminal.

`serve` writes a small JSON file while it runs (`serve-<pid>.json` in a per-user directory)
naming its streams and Pub/Sub URLs, its HTTP address and its pid; an operator command run
with no Redis URL in its environment reads the files of the live ones. A file whose process
is gone is stale and ignored (and removed).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

# The variables that name the servers (pydantic-settings reads names case-insensitively).
URL_VARIABLES = (
    "REDIS_STREAMS_URL",
    "EVENT_ROUTER_REDIS_STREAMS_URL",
    "REDIS_PUBSUB_URL",
    "EVENT_ROUTER_REDIS_PUBSUB_URL",
)
DEFAULT_STREAMS_URL = "redis://localhost:6379/0"
_PREFIX = "serve-"


@dataclass(frozen=True, slots=True)
class ServeRecord:
    """What a running `serve` tells other processes: where its Redis and its HTTP app are.

    `streams_url` is None for `serve --in-memory`, whose streams no other process can reach.
    `redis_pid` is the embedded Redis child's pid, when serve runs one.
    """

    pid: int
    http_url: str
    streams_url: str | None
    pubsub_url: str | None
    redis_pid: int | None = None

    @property
    def in_memory(self) -> bool:
        return self.streams_url is None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ServeRecord:
        """The record in `text`, or `ValueError` when it is not one."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        pid, http_url = data.get("pid"), data.get("http_url")
        streams_url, pubsub_url = data.get("streams_url"), data.get("pubsub_url")
        redis_pid = data.get("redis_pid")
        if not (isinstance(pid, int) and pid > 0 and isinstance(http_url, str)):
            raise ValueError("no pid or http_url")
        if not all(isinstance(u, str | None) for u in (streams_url, pubsub_url)):
            raise ValueError("a URL is not a string")
        if not (redis_pid is None or (isinstance(redis_pid, int) and redis_pid > 0)):
            raise ValueError("redis_pid is not a pid")
        return cls(pid, http_url, streams_url, pubsub_url, redis_pid)


def discovery_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_RUNTIME_DIR/eco-router` (per user, emptied at logout), else
    `~/.cache/eco-router` (or under `$XDG_CACHE_HOME`)."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "eco-router"
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "eco-router"


@contextlib.contextmanager
def announced(record: ServeRecord, directory: Path) -> Iterator[Path]:
    """The record written to `directory` for as long as the block runs, then removed."""
    path = write_record(record, directory)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def write_record(record: ServeRecord, directory: Path) -> Path:
    """Write `record` as `serve-<pid>.json`, readable by this user only, atomically (a reader
    never sees half a file)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{_PREFIX}{record.pid}.json"
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".serve-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(record.to_json())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def live_records(directory: Path) -> list[ServeRecord]:
    """The records of the serve processes still alive, most recently started first; files of
    dead processes are removed, unreadable ones ignored."""
    found: list[tuple[float, ServeRecord]] = []
    for path in directory.glob(f"{_PREFIX}*.json"):
        try:
            record = ServeRecord.from_json(path.read_text())
            started = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        alive = _alive(record.pid) and (record.redis_pid is None or _alive(record.redis_pid))
        if not alive:
            path.unlink(missing_ok=True)
            continue
        found.append((started, record))
    return [record for _, record in sorted(found, key=lambda f: f[0], reverse=True)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, though not likely ours
    return True


@dataclass(frozen=True, slots=True)
class ServerChoice:
    """The streams server an operator command talks to and why that one."""

    streams_url: str
    pubsub_url: str | None
    via: str
    # From a serve's record: the settings are given these URLs, not the environment's.
    discovered: bool = False


class InMemoryServeOnly(Exception):
    """The only serve running uses in-memory adapters, which no other process can reach."""

    def __init__(self, record: ServeRecord) -> None:
        super().__init__(
            f"the running serve (pid {record.pid}, {record.http_url}) uses in-memory adapters, "
            "which no other process can reach; stop it and run `make run` or "
            "`eco-router serve --embedded-redis` (a private Redis the CLI finds by itself)"
        )
        self.record = record


def choose_server(environ: Mapping[str, str], records: list[ServeRecord]) -> ServerChoice:
    """The URL variables when any is set; else the newest serve with an embedded Redis; else
    the default URL. Raises `InMemoryServeOnly` when only in-memory serves run."""
    given = {k.upper(): v for k, v in environ.items() if k.upper() in URL_VARIABLES}
    if given:
        name = next((n for n in URL_VARIABLES[:2] if n in given), None)
        if name is None:
            return ServerChoice(DEFAULT_STREAMS_URL, None, "the default")
        return ServerChoice(given[name], None, name)
    for record in records:
        if record.streams_url is not None:
            return ServerChoice(
                record.streams_url,
                record.pubsub_url,
                f"embedded Redis of serve, pid {record.pid}",
                discovered=True,
            )
    if records:
        raise InMemoryServeOnly(records[0])
    return ServerChoice(
        DEFAULT_STREAMS_URL,
        None,
        "the default: no REDIS_STREAMS_URL set and no `serve --embedded-redis` running",
    )
