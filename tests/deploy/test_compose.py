"""compose.yaml: the same image and settings contract as the Kubernetes kit (no engine here)."""

from __future__ import annotations

import tomllib
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from eco_router.entrypoints.cli import _parser
from eco_router.entrypoints.settings import load_settings, unknown_variables
from tests.deploy.dockerfile import read_image
from tests.deploy.settings_env import settings_variables, unknown
from tests.deploy.tools import REPO

COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
OURS = ["router", "gateway", "producer"]


def test_the_pipeline_is_two_redis_a_router_a_gateway_and_a_producer() -> None:
    assert set(SERVICES) == {"redis-streams", "redis-pubsub", *OURS}


@pytest.mark.parametrize("name", OURS)
def test_our_services_run_this_image_read_only(name: str) -> None:
    service = SERVICES[name]
    assert service["image"] == f"eco-router:{VERSION}"
    assert service["build"] == "."
    assert service["read_only"] is True
    assert service["tmpfs"] == ["/tmp"]
    assert service["cap_drop"] == ["ALL"]
    for redis in ("redis-streams", "redis-pubsub"):
        assert service["depends_on"][redis] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", OURS)
def test_every_variable_is_a_setting_and_loads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: str(v) for k, v in SERVICES[name]["environment"].items()}
    assert unknown(env) == []
    assert unknown_variables(env) == []
    for variable in settings_variables():
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    settings = load_settings()
    hosts = {urlsplit(settings.redis_streams_url).hostname, urlsplit(settings.pubsub_url).hostname}
    assert hosts == {"redis-streams", "redis-pubsub"}


def test_each_command_is_one_the_cli_accepts() -> None:
    image = read_image()
    assert image.exec_form("ENTRYPOINT") == ["eco-router"]
    router = _parser().parse_args(SERVICES["router"]["command"])
    gateway = _parser().parse_args(SERVICES["gateway"]["command"])
    producer = _parser().parse_args(SERVICES["producer"]["command"])
    assert router.command == "worker"
    assert (gateway.command, gateway.no_router, gateway.host) == ("serve", True, "0.0.0.0")
    assert producer.command == "demo"
    assert SERVICES["gateway"]["ports"] == [f"127.0.0.1:{gateway.port}:{gateway.port}"]
    router_port = SERVICES["router"]["environment"]["EVENT_ROUTER_HTTP_PORT"]
    assert SERVICES["router"]["ports"] == [f"127.0.0.1:{router_port}:{router_port}"]
    assert {gateway.port, int(router_port)} == image.exposed


def test_the_streams_redis_is_durable_and_the_pubsub_one_volatile() -> None:
    streams = SERVICES["redis-streams"]["command"]
    pubsub = SERVICES["redis-pubsub"]["command"]
    assert _option(streams, "--appendonly") == "yes"
    assert _option(streams, "--appendfsync") == "everysec"
    assert any(v.endswith(":/data") for v in SERVICES["redis-streams"]["volumes"])
    assert _option(pubsub, "--appendonly") == "no"
    assert _option(pubsub, "--save") == ""
    assert "volumes" not in SERVICES["redis-pubsub"]


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]
