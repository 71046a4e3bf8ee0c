"""Configuration from the environment: defaults, parsing and errors that name the variable."""

from __future__ import annotations

import logging

import pytest

from eco_router.domain.streams import StreamFamily
from eco_router.entrypoints.cli import log_start, main
from eco_router.entrypoints.settings import ConfigError, load_settings

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
        assert settings.streams == (StreamFamily("scan:events", 4),)
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
        assert "EVENT_ROUTER_JWT_SECRET: Value error, must be at least 32 bytes" in err
        assert "hunter2" not in err

    def test_exp_is_required_unless_switched_off(self, monkeypatch: pytest.MonkeyPatch) -> None:
        assert load_settings().jwt_require_exp is True
        monkeypatch.setenv("EVENT_ROUTER_JWT_REQUIRE_EXP", "false")
        assert load_settings().jwt_require_exp is False

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
