"""Configuration from the environment: defaults, parsing and errors that name the variable."""

from __future__ import annotations

import logging

import pytest

from eco_router.domain.streams import StreamFamily
from eco_router.entrypoints.cli import log_start, main
from eco_router.entrypoints.settings import ConfigError, load_settings, unknown_variables

ENV_PREFIXES = ("EVENT_ROUTER_", "REDIS_STREAMS_URL", "REDIS_PUBSUB_URL", "POD_NAME")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(ENV_PREFIXES):
            monkeypatch.delenv(name)


class TestDefaults:
    def test_defaults_follow_the_documented_contract(self) -> None:
        settings = load_settings()
        assert settings.redis_streams_url == "redis://localhost:6379/0"
        assert settings.pubsub_url == settings.redis_streams_url
        # Both domains of the reference design: scan pipelines and chat answers.
        assert settings.streams == (StreamFamily("scan:events", 4), StreamFamily("chat:events", 4))
        assert settings.consumer_group == "eventrouter"
        assert (settings.read_count, settings.read_block_ms) == (100, 5000)
        assert (settings.state_ttl_s, settings.published_ttl_s) == (3600, 7200)
        assert (settings.reclaim_min_idle_ms, settings.reclaim_interval_s) == (300_000, 60)
        assert (settings.max_deliveries, settings.history_size) == (5, 100)
        assert settings.channel_prefix == "sse:events"
        assert settings.http_port == 8001
        assert settings.lease_ttl_ms == 4000
        assert settings.lease_renew_ms == 1000
        assert (settings.max_event_bytes, settings.max_result_bytes) == (8192, 131_072)
        assert settings.history_max_bytes == 1_048_576

    def test_an_idle_job_is_given_up_after_ten_minutes(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        assert load_settings().sse_job_idle_s == 600
        monkeypatch.setenv("EVENT_ROUTER_SSE_JOB_IDLE_S", "90")
        assert load_settings().sse_job_idle_s == 90

    def test_api_docs_are_off_unless_asked_for(self, monkeypatch: pytest.MonkeyPatch) -> None:
        assert load_settings().api_docs is False
        monkeypatch.setenv("EVENT_ROUTER_API_DOCS", "true")
        assert load_settings().api_docs is True

    def test_consumer_name_comes_from_pod_name(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("POD_NAME", "router-7f9c-abcde")
        assert load_settings().consumer_name == "router-7f9c-abcde"

    def test_consumer_name_falls_back_to_host_and_pid(self) -> None:
        import os

        assert load_settings().consumer_name.endswith(f"-{os.getpid()}")


class TestParsing:
    def test_several_families_are_read_from_one_variable(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_STREAMS", "scan:events=4, chat:events=2")
        families = load_settings().streams
        assert families == (StreamFamily("scan:events", 4), StreamFamily("chat:events", 2))
        assert families[1].streams == ("chat:events:0", "chat:events:1")

    def test_pubsub_url_may_differ_and_carry_credentials(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("REDIS_STREAMS_URL", "rediss://router:s3cret@redis-a:6380/1")
        monkeypatch.setenv("REDIS_PUBSUB_URL", "redis://redis-b:6379/0")
        settings = load_settings()
        assert settings.redis_streams_url == "rediss://router:s3cret@redis-a:6380/1"
        assert settings.pubsub_url == "redis://redis-b:6379/0"


class TestErrors:
    @pytest.mark.parametrize(
        ("variable", "value"),
        [
            ("EVENT_ROUTER_READ_COUNT", "abc"),
            ("EVENT_ROUTER_READ_COUNT", "0"),
            ("EVENT_ROUTER_STREAMS", "scan:events"),
            ("EVENT_ROUTER_STREAMS", "scan:events=4,scan:other=2"),
            ("EVENT_ROUTER_STREAMS", "scan:{events}=4"),
            ("REDIS_STREAMS_URL", "http://localhost:6379"),
            ("EVENT_ROUTER_MAX_DELIVERIES", "-1"),
            ("EVENT_ROUTER_HTTP_PORT", "70000"),
            ("EVENT_ROUTER_LOG_LEVEL", "LOUD"),
            ("EVENT_ROUTER_ORDER_WAIT_MS", "-5"),
            ("EVENT_ROUTER_ORDER_WAIT_MS", "a while"),
            ("EVENT_ROUTER_JWT_SECRET", "short-secret"),
            ("EVENT_ROUTER_JWT_SECRET", "x" * 31),
            ("EVENT_ROUTER_JWT_REQUIRE_EXP", "sometimes"),
            ("EVENT_ROUTER_CHANNEL_PREFIX", "}sse:events"),
            ("EVENT_ROUTER_CHANNEL_PREFIX", "{sse}:events"),
        ],
    )
    def test_an_invalid_value_is_refused_naming_the_variable(
        self, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
    ) -> None:
        monkeypatch.setenv(variable, value)
        with pytest.raises(ConfigError, match=variable):
            load_settings()

    def test_markers_may_not_expire_before_the_state(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("EVENT_ROUTER_PUBLISHED_TTL_S", "60")
        with pytest.raises(ConfigError, match="EVENT_ROUTER_PUBLISHED_TTL_S"):
            load_settings()

    @pytest.mark.parametrize(
        ("variable", "value"),
        [
            ("EVENT_ROUTER_MAX_EVENT_BYTES", "200000"),
            ("EVENT_ROUTER_MAX_RESULT_BYTES", "4096"),
            ("EVENT_ROUTER_HISTORY_MAX_BYTES", "65536"),
        ],
    )
    def test_an_event_limit_must_fit_the_next_limit_up(
        self, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
    ) -> None:
        monkeypatch.setenv(variable, value)
        with pytest.raises(ConfigError, match="EVENT_ROUTER_MAX_EVENT_BYTES <= "):
            load_settings()

    def test_a_weak_jwt_secret_stops_startup_with_one_line_and_exit_2(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_JWT_SECRET", "hunter2")
        # Nothing listens there: were the settings accepted, the command could reach no server.
        monkeypatch.setenv("REDIS_STREAMS_URL", "redis://127.0.0.1:1/0")

        assert main(["dlq", "replay", "--all"]) == 2

        err = capsys.readouterr().err
        assert err.splitlines() == [
            "error: invalid configuration: EVENT_ROUTER_JWT_SECRET: must be at least 32 bytes "
            "for HS256 (e.g. the output of `openssl rand -base64 32`) (value hidden)"
        ]
        assert "hunter2" not in err

    def test_exp_is_required_unless_switched_off(self, monkeypatch: pytest.MonkeyPatch) -> None:
        assert load_settings().jwt_require_exp is True
        monkeypatch.setenv("EVENT_ROUTER_JWT_REQUIRE_EXP", "false")
        assert load_settings().jwt_require_exp is False

    def test_tokens_are_bounded_at_8_kib_unless_set(self, monkeypatch: pytest.MonkeyPatch) -> None:
        assert load_settings().jwt_max_bytes == 8192
        monkeypatch.setenv("EVENT_ROUTER_JWT_MAX_BYTES", "16384")
        assert load_settings().jwt_max_bytes == 16384
        monkeypatch.setenv("EVENT_ROUTER_JWT_MAX_BYTES", "100")
        with pytest.raises(ConfigError, match="EVENT_ROUTER_JWT_MAX_BYTES"):
            load_settings()

    def test_the_cli_exits_2_with_the_message_on_stderr(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_READ_BLOCK_MS", "soon")
        assert main(["worker"]) == 2
        assert "EVENT_ROUTER_READ_BLOCK_MS" in capsys.readouterr().err

    def test_the_cli_refuses_a_bad_port_argument(self) -> None:
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--port", "http"])
        assert exit_info.value.code == 2


class TestRetiredSettings:
    def test_order_wait_ms_still_loads_and_the_start_line_says_it_is_unused(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        settings = load_settings(order_wait_ms=1000)

        with caplog.at_level(logging.WARNING):
            log_start("worker", settings)

        assert "EVENT_ROUTER_ORDER_WAIT_MS is no longer used" in caplog.text

    def test_without_it_nothing_is_said(self, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level(logging.WARNING):
            log_start("worker", load_settings())

        assert caplog.text == ""


class TestSecretsInErrors:
    def test_an_invalid_url_is_echoed_without_its_password(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("REDIS_PUBSUB_URL", "http://router:s3cret-pw@redis-b:6379/0")

        with pytest.raises(ConfigError) as raised:
            load_settings()

        assert "s3cret-pw" not in str(raised.value)
        assert "'http://router:***@redis-b:6379/0'" in str(raised.value)

    def test_a_rule_across_settings_echoes_no_setting_at_all(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("REDIS_STREAMS_URL", "redis://router:s3cret-pw@redis-a:6379/0")
        monkeypatch.setenv("EVENT_ROUTER_JWT_SECRET", "jwt-secret-" + "k" * 40)
        monkeypatch.setenv("EVENT_ROUTER_PUBLISHED_TTL_S", "60")

        assert main(["worker"]) == 2

        err = capsys.readouterr().err
        assert "EVENT_ROUTER_PUBLISHED_TTL_S must be at least" in err
        assert "s3cret-pw" not in err
        assert "jwt-secret-" not in err

    def test_an_invalid_secret_is_never_echoed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("EVENT_ROUTER_JWT_SECRET", "")

        with pytest.raises(ConfigError) as raised:
            load_settings()

        assert "EVENT_ROUTER_JWT_SECRET" in str(raised.value)
        assert "value hidden" in str(raised.value)


# Every URL here names a closed port (1) or nothing at all, and so does the other variable: were
# a bad URL accepted, the command would find no server, never one it does not own.
CLOSED = "redis://127.0.0.1:1/0"


class TestRedisUrls:
    @pytest.mark.parametrize(
        ("url", "problem"),
        [
            ("redis://:pw-secret@[bad", "is not a valid URL (Invalid IPv6 URL)"),
            ("redis://127.0.0.1:notaport/0", "port must be a number from 1 to 65535"),
            ("redis://127.0.0.1:70000/0", "port must be a number from 1 to 65535"),
            ("redis://127.0.0.1:0/0", "port must be a number from 1 to 65535"),
            ("redis://127.0.0.1:1/abc", "database 'abc' is not a number"),
            ("redis://127.0.0.1:1/0?db=x", "database 'x' is not a number"),
            ("redis://:1/0", "names no host"),
            ("unix://", "names no socket path"),
            ("unix:///nonexistent/redis.sock?db=one", "database 'one' is not a number"),
            ("http://127.0.0.1:1/0", "must start with redis://, rediss://, unix://, redis+"),
            ("redis+sentinel://:pw-secret@127.0.0.1:1", "names no master"),
            ("redis+sentinel://127.0.0.1:1,/mymaster", "names an empty host"),
            ("redis+sentinel://127.0.0.1:99999/mymaster/0", "port of '127.0.0.1:99999' must be"),
            ("redis+sentinel://127.0.0.1:1/mymaster/x", "database 'x' is not a number"),
            ("redis+sentinel://127.0.0.1:1/m?ssl_ca_certs=/ca.pem", "ssl_ca_certs need TLS"),
            ("redis+sentinel://127.0.0.1:1/m?sentinel_pass=pw-secret", "unknown option"),
        ],
    )
    @pytest.mark.parametrize("variable", ["REDIS_STREAMS_URL", "REDIS_PUBSUB_URL"])
    @pytest.mark.parametrize("command", [["worker"], ["serve"], ["status"]])
    def test_a_bad_url_is_one_line_naming_the_variable_and_exit_2(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        url: str,
        problem: str,
        variable: str,
        command: list[str],
    ) -> None:
        monkeypatch.setenv("REDIS_STREAMS_URL", CLOSED)
        monkeypatch.setenv("REDIS_PUBSUB_URL", CLOSED)
        monkeypatch.setenv(variable, url)

        assert main(command) == 2

        captured = capsys.readouterr()
        [line] = captured.err.splitlines()
        assert line.startswith(f"error: invalid configuration: {variable}: {problem}")
        assert "pw-secret" not in captured.err + captured.out

    @pytest.mark.parametrize(
        "url",
        [
            "redis://localhost",
            "redis://redis-a:6380/15",
            "redis://router:p%40ss@[::1]:6379/2",
            "rediss://router:pw@redis-b:6380/0?ssl_ca_certs=/etc/ca.pem",
            "unix:///run/redis/redis.sock",
            "unix://router:pw@/run/redis/redis.sock?db=3",
        ],
    )
    def test_every_form_redis_py_reads_is_accepted(self, url: str) -> None:
        assert load_settings(REDIS_STREAMS_URL=url).redis_streams_url == url


class TestProblemLines:
    def test_each_problem_is_one_line_without_pydantic_prefixes(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("REDIS_STREAMS_URL", CLOSED)
        monkeypatch.setenv("EVENT_ROUTER_LOG_LEVEL", "LOUD")
        monkeypatch.setenv("EVENT_ROUTER_READ_COUNT", "abc")

        assert main(["worker"]) == 2

        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2
        assert all(line.startswith("error: invalid configuration: EVENT_ROUTER_") for line in lines)
        assert "EVENT_ROUTER_LOG_LEVEL: must be DEBUG, INFO" in "\n".join(lines)
        assert "Value error" not in "\n".join(lines)


class TestUnknownVariables:
    def test_a_misspelled_variable_is_named_with_the_closest_setting(self) -> None:
        environ = {
            "EVENT_ROUTER_CONSOL": "true",
            "EVENT_ROUTER_CONSOLE": "true",
            "EVENT_ROUTER_QQQQQQQQ": "1",
            "REDIS_STREAMS_URL": "redis://h/0",
            "PATH": "/usr/bin",
        }

        assert unknown_variables(environ) == [
            "EVENT_ROUTER_CONSOL is not a setting and is ignored "
            "(did you mean EVENT_ROUTER_CONSOLE?)",
            "EVENT_ROUTER_QQQQQQQQ is not a setting and is ignored",
        ]

    def test_the_producer_sdks_variables_are_no_typos(self) -> None:
        environ = {"EVENT_ROUTER_PRODUCER_DOMAIN": "scan", "EVENT_ROUTER_PRODUCER_SHARDS": "4"}

        assert unknown_variables(environ) == []

    def test_the_cli_warns_once_at_startup(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("EVENT_ROUTER_CONSOL", "true")
        # Port 1 is closed: the command stops at its first connection.
        monkeypatch.setenv("REDIS_STREAMS_URL", CLOSED)

        main(["status"])

        warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
        assert len(warnings) == 1
        assert warnings[0].endswith(
            "EVENT_ROUTER_CONSOL is not a setting and is ignored "
            "(did you mean EVENT_ROUTER_CONSOLE?)"
        )


class TestOperatorCommandsStartup:
    @pytest.mark.parametrize(
        "command",
        [["status"], ["state", "job-7"], ["dlq", "list"], ["dlq", "replay", "--all"]],
    )
    def test_an_unreachable_server_is_the_workers_line_and_exit_3(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        command: list[str],
    ) -> None:
        monkeypatch.setenv("REDIS_STREAMS_URL", "redis://router:pw-secret@127.0.0.1:1/0")

        assert main(command) == 3

        assert capsys.readouterr().err.splitlines() == [
            "error: cannot reach the streams Redis at redis://router:***@127.0.0.1:1/0: "
            "connection refused"
        ]
