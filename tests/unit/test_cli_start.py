"""What the CLI does before it reaches a server: which server it picks, what it imports,
and the one-line refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eco_router.entrypoints import embedded_redis
from eco_router.entrypoints.cli import main
from eco_router.entrypoints.discovery import (
    InMemoryServeOnly,
    ServeRecord,
    choose_server,
    live_records,
    write_record,
)
from eco_router.entrypoints.startup_checks import StartupFailure

WEB_STACK = ("fastapi", "uvicorn", "starlette")
SERVE_ONLY = (*WEB_STACK, "dependency_injector", "eco_router.entrypoints.container")
# What the settings once pulled into every command: PyJWT, the producer SDK, uvloop, the
# gateway's request rules.
NOT_FOR_SETTINGS = (
    "jwt",
    "eco_router.producer",
    "uvloop",
    "eco_router.entrypoints.http.request_bounds",
)
# Values of the ports `publish` does not use (reading, leases, state, dead letters) and the
# adapters behind them.
NOT_FOR_PUBLISH = (
    "eco_router.application.port_values",
    "eco_router.domain.verdict",
    "eco_router.adapters.redis.router.state_store",
    "eco_router.adapters.redis.router.event_source",
    "eco_router.adapters.redis.router.lease_store",
)
PUBLISH = ("publish", "--job", "j", "--stage", "vision", "--status", "started")


def make_record(**overrides: object) -> ServeRecord:
    values: dict[str, object] = {
        "pid": os.getpid(),
        "http_url": "http://127.0.0.1:8000/",
        "streams_url": "redis://127.0.0.1:6399/0",
        "pubsub_url": "redis://127.0.0.1:6399/0",
        "redis_pid": os.getpid(),
    }
    values.update(overrides)
    return ServeRecord(**values)  # type: ignore[arg-type]


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


class TestChooseServer:
    def test_a_url_in_the_environment_wins_over_a_running_serve(self) -> None:
        chosen = choose_server({"REDIS_STREAMS_URL": "redis://db:6379/1"}, [make_record()])

        assert (chosen.streams_url, chosen.via, chosen.discovered) == (
            "redis://db:6379/1",
            "REDIS_STREAMS_URL",
            False,
        )

    def test_the_prefixed_name_and_any_case_count_as_set(self) -> None:
        chosen = choose_server({"event_router_redis_streams_url": "redis://db/0"}, [make_record()])

        assert chosen.via == "EVENT_ROUTER_REDIS_STREAMS_URL"

    def test_a_pubsub_url_alone_keeps_the_default_streams_server(self) -> None:
        chosen = choose_server({"REDIS_PUBSUB_URL": "redis://bus/0"}, [make_record()])

        assert (chosen.streams_url, chosen.discovered) == ("redis://localhost:6379/0", False)

    def test_with_no_url_the_newest_embedded_redis_is_used(self) -> None:
        newest = make_record(pid=2, streams_url="redis://127.0.0.1:7000/0")
        chosen = choose_server({}, [make_record(pid=3, streams_url=None), newest, make_record()])

        assert chosen.streams_url == "redis://127.0.0.1:7000/0"
        assert chosen.via == "embedded Redis of serve, pid 2"
        assert chosen.discovered

    def test_only_in_memory_serves_is_an_error_naming_the_way_out(self) -> None:
        with pytest.raises(InMemoryServeOnly, match=r"make run` or `eco-router serve --embedded"):
            choose_server({}, [make_record(pid=3, streams_url=None, pubsub_url=None)])

    def test_nothing_running_is_the_default_said_as_such(self) -> None:
        chosen = choose_server({}, [])

        assert chosen.streams_url == "redis://localhost:6379/0"
        assert chosen.via.startswith("the default: no REDIS_STREAMS_URL set")


class TestRecords:
    def test_a_live_serves_record_is_read_back(self, tmp_path: Path) -> None:
        record = make_record()
        path = write_record(record, tmp_path / "eco-router")

        assert live_records(tmp_path / "eco-router") == [record]
        assert path.stat().st_mode & 0o077 == 0

    @pytest.mark.parametrize("dead", ["pid", "redis_pid"])
    def test_a_record_of_a_dead_process_is_ignored_and_removed(
        self, tmp_path: Path, dead: str
    ) -> None:
        path = write_record(make_record(**{dead: dead_pid()}), tmp_path)

        assert live_records(tmp_path) == []
        assert not path.exists()

    @pytest.mark.parametrize(
        "text", ["{", "[]", '{"pid": "1", "http_url": "x"}', '{"pid": 1, "http_url": 2}']
    )
    def test_an_unreadable_record_is_ignored(self, tmp_path: Path, text: str) -> None:
        (tmp_path / "serve-1.json").write_text(text)

        assert live_records(tmp_path) == []

    def test_no_directory_is_no_record(self, tmp_path: Path) -> None:
        assert live_records(tmp_path / "missing") == []


class TestEmbeddedRedisBinary:
    def test_a_missing_redis_server_is_one_line_naming_the_package(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(embedded_redis.shutil, "which", lambda *a, **k: None)

        with pytest.raises(StartupFailure) as failure:
            embedded_redis.redis_server_binary()

        assert failure.value.exit_code == 3
        assert "install the redis-server package" in str(failure.value)
        assert "\n" not in str(failure.value)

    def test_serve_stops_with_that_line_and_exit_3(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setattr(embedded_redis.shutil, "which", lambda *a, **k: None)

        assert main(["serve", "--embedded-redis", "--port", "0"]) == 3

        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("error: --embedded-redis needs redis-server")


def imported_by(*args: str) -> list[str]:
    """The modules `eco-router ARGS` has imported once it ends (run in a fresh interpreter;
    no server listens at the URL it is given, so a command stops after its imports)."""
    code = (
        "import json, sys\n"
        "from eco_router.entrypoints import cli\n"
        "try:\n"
        f"    cli.main({list(args)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ROUTER_", "REDIS_"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "REDIS_STREAMS_URL": "redis://127.0.0.1:1/0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return modules


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(f"{n}.") for m in modules)]


class TestImports:
    def test_version_imports_no_web_stack_and_no_redis(self) -> None:
        modules = imported_by("--version")

        assert _loaded(modules, (*WEB_STACK, "redis", "pydantic")) == []

    @pytest.mark.parametrize(
        "args",
        [PUBLISH, ("status",), ("token", "--job", "j")],
        ids=["publish", "status", "token"],
    )
    def test_an_operator_command_imports_neither_the_web_stack_nor_the_container(
        self, args: tuple[str, ...]
    ) -> None:
        assert _loaded(imported_by(*args), SERVE_ONLY) == []

    @pytest.mark.parametrize("args", [PUBLISH, ("status",)], ids=["publish", "status"])
    def test_loading_the_settings_imports_no_token_code_producer_or_event_loop(
        self, args: tuple[str, ...]
    ) -> None:
        assert _loaded(imported_by(*args), NOT_FOR_SETTINGS) == []

    def test_publish_imports_only_the_publisher_of_the_redis_adapters(self) -> None:
        assert _loaded(imported_by(*PUBLISH), NOT_FOR_PUBLISH) == []
