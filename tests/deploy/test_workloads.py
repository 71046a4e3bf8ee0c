"""The rendered Deployments: hardening, probes, resources, ports, settings and shutdown."""

from __future__ import annotations

import argparse
import copy
import inspect
import tomllib

import pytest
from fastapi.routing import APIRoute

from eco_router.adapters.redis.connections.topology import SentinelGroup, parse_redis_url
from eco_router.entrypoints.cli import _parser
from eco_router.entrypoints.http import ops_routes, sse_routes
from eco_router.entrypoints.http.server_config import server_config
from eco_router.entrypoints.runner import RouterRunner
from eco_router.entrypoints.settings import Settings, load_settings, unknown_variables
from tests.deploy.dockerfile import read_image
from tests.deploy.settings_env import known_variables, settings_variables, unknown
from tests.deploy.tools import REPO, Document, find, of_kind, render
from tests.deploy.workloads import (
    container_port,
    containers,
    environment,
    pod_spec,
    probe_problems,
    resource_problems,
    secret_names,
    security_problems,
    service_problems,
    tmp_problems,
)

OVERLAYS = ["base", "dev", "production"]
ROLES = ["router", "gateway"]
IMAGE = read_image()
IMAGE_UID = IMAGE.user[0]


def _paths(*routers: object) -> set[str]:
    return {r.path for router in routers for r in router.routes if isinstance(r, APIRoute)}  # type: ignore[attr-defined]


# What each process serves on its one port (entrypoints/worker.py, entrypoints/http/app.py).
ROUTER_PATHS = _paths(ops_routes.router, ops_routes.metrics_router)
GATEWAY_PATHS = _paths(ops_routes.public_router, ops_routes.metrics_router, sse_routes.router)


def command_of(deployment: Document) -> argparse.Namespace:
    """The container's command as the image runs it (ENTRYPOINT + args), parsed by the CLI."""
    container = containers(deployment)[0]
    command = container.get("command", IMAGE.exec_form("ENTRYPOINT"))
    assert command == ["eco-router"], command
    return _parser().parse_args(container.get("args", IMAGE.exec_form("CMD")))


def eco_router_deployments(docs: list[Document]) -> list[Document]:
    return [
        d
        for d in of_kind(docs, "Deployment")
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") in ROLES
    ]


def role(docs: list[Document], name: str) -> Document:
    return find(docs, "Deployment", name)


def router_port(docs: list[Document]) -> int:
    env = environment(docs, containers(role(docs, "router"))[0])
    return int(env.get("EVENT_ROUTER_HTTP_PORT", Settings.model_fields["http_port"].default))


def gateway_port(docs: list[Document]) -> int:
    return int(command_of(role(docs, "gateway")).port)


@pytest.mark.parametrize("overlay", OVERLAYS)
class TestEveryOverlay:
    def test_both_roles_run_the_image_as_its_own_user_hardened(self, overlay: str) -> None:
        docs = render(overlay)
        for deployment in eco_router_deployments(docs):
            assert security_problems(deployment, uid=IMAGE_UID) == []
            assert tmp_problems(deployment) == []

    def test_every_deployment_is_hardened_redis_included(self, overlay: str) -> None:
        for deployment in of_kind(render(overlay), "Deployment"):
            assert security_problems(deployment) == []

    def test_every_deployment_has_requests_and_limits(self, overlay: str) -> None:
        for deployment in of_kind(render(overlay), "Deployment"):
            assert resource_problems(deployment) == []

    def test_the_router_runs_worker_and_probes_what_it_serves(self, overlay: str) -> None:
        docs = render(overlay)
        router = role(docs, "router")
        assert command_of(router).command == "worker"
        port = router_port(docs)
        assert containers(router)[0]["ports"] == [
            {"name": "http", "containerPort": port, "protocol": "TCP"}
        ]
        env = environment(docs, containers(router)[0])
        assert env["EVENT_ROUTER_HTTP_HOST"] == "0.0.0.0"
        assert probe_problems(router, port=port, paths=ROUTER_PATHS) == []

    def test_the_gateway_serves_sse_only_on_every_interface(self, overlay: str) -> None:
        docs = render(overlay)
        gateway = role(docs, "gateway")
        args = command_of(gateway)
        assert (args.command, args.no_router, args.in_memory) == ("serve", True, False)
        assert args.host == "0.0.0.0"
        assert [p["containerPort"] for p in containers(gateway)[0]["ports"]] == [args.port]
        assert probe_problems(gateway, port=args.port, paths=GATEWAY_PATHS) == []
        env = environment(docs, containers(gateway)[0])
        assert env["EVENT_ROUTER_GATEWAY_METRICS"] == "true"  # so /metrics exists

    def test_every_variable_set_is_one_the_program_reads(self, overlay: str) -> None:
        docs = render(overlay)
        for deployment in eco_router_deployments(docs):
            env = environment(docs, containers(deployment)[0])
            assert unknown(env) == []
        for config_map in of_kind(docs, "ConfigMap"):
            # The dashboard's ConfigMap is a file for Grafana, not an environment.
            if config_map["metadata"]["name"].startswith("eco-router-config"):
                assert unknown(config_map["data"]) == []

    def test_each_roles_environment_loads_as_valid_settings(
        self, overlay: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        docs = render(overlay)
        for deployment in eco_router_deployments(docs):
            env = environment(docs, containers(deployment)[0])
            for name in settings_variables():
                monkeypatch.delenv(name, raising=False)
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            load_settings()  # raises ConfigError naming the variable
            assert unknown_variables(env) == []

    def test_secrets_are_only_referenced(self, overlay: str) -> None:
        docs = render(overlay)
        assert of_kind(docs, "Secret") == []
        for deployment in eco_router_deployments(docs):
            assert secret_names(containers(deployment)[0]) == {"eco-router-secrets"}
            for entry in containers(deployment)[0].get("env", []):
                assert "SECRET" not in entry["name"] or "valueFrom" in entry, entry

    def test_services_and_budgets_select_pods_and_name_their_ports(self, overlay: str) -> None:
        docs = render(overlay)
        assert service_problems(docs) == []
        gateway = find(docs, "Service", "gateway")["spec"]["ports"]
        router = find(docs, "Service", "router-metrics")["spec"]["ports"]
        assert [(p["name"], p["port"]) for p in gateway] == [("http", gateway_port(docs))]
        assert [(p["name"], p["port"]) for p in router] == [("http", router_port(docs))]
        budgets = {p["metadata"]["name"]: p for p in of_kind(docs, "PodDisruptionBudget")}
        assert set(budgets) == set(ROLES)
        for name, budget in budgets.items():
            labels = role(docs, name)["spec"]["template"]["metadata"]["labels"]
            assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
            # minAvailable would block every node drain while one replica runs.
            assert budget["spec"] == {**budget["spec"], "maxUnavailable": 1}

    def test_the_standard_labels_are_on_every_workload(self, overlay: str) -> None:
        docs = render(overlay)
        for doc in [*eco_router_deployments(docs), *of_kind(docs, "Service")]:
            labels = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "eco-router"
            assert labels["app.kubernetes.io/part-of"] == "eco-router"
            assert labels["app.kubernetes.io/component"] in {*ROLES, "redis"}
        for deployment in eco_router_deployments(docs):
            pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert pod_labels["app.kubernetes.io/part-of"] == "eco-router"
            assert pod_labels["app.kubernetes.io/component"] == deployment["metadata"]["name"]

    def test_the_pods_outlast_their_drain(self, overlay: str) -> None:
        docs = render(overlay)
        drain_s = inspect.signature(RouterRunner).parameters["drain_timeout_s"].default
        router = pod_spec(role(docs, "router"))
        # Drain, then closing the connections: docs/RUNNING.md promises exit within 10 s.
        assert router["terminationGracePeriodSeconds"] >= 2 * drain_s + 10
        gateway = pod_spec(role(docs, "gateway"))
        graceful_s = server_config(None, Settings(), host="0.0.0.0", port=8000)
        pre_stop = containers(role(docs, "gateway"))[0]["lifecycle"]["preStop"]["exec"]
        assert pre_stop["command"][0] == "sleep"
        needed = int(pre_stop["command"][1]) + graceful_s.timeout_graceful_shutdown
        assert gateway["terminationGracePeriodSeconds"] >= 2 * needed

    def test_no_token_reaches_the_api(self, overlay: str) -> None:
        docs = render(overlay)
        for deployment in of_kind(docs, "Deployment"):
            assert pod_spec(deployment)["automountServiceAccountToken"] is False


class TestChecksFail:
    """Each check above finds the problem it is for."""

    def test_a_writable_root_is_found(self) -> None:
        router = copy.deepcopy(role(render("base"), "router"))
        containers(router)[0]["securityContext"]["readOnlyRootFilesystem"] = False
        assert security_problems(router, uid=IMAGE_UID) == [
            "router/router: readOnlyRootFilesystem is not True"
        ]

    def test_another_user_than_the_images_is_found(self) -> None:
        router = copy.deepcopy(role(render("base"), "router"))
        assert "router: pod runAsUser 10001 is not 1000" in security_problems(router, uid=1000)

    def test_a_missing_readiness_probe_is_found(self) -> None:
        docs = render("base")
        gateway = copy.deepcopy(role(docs, "gateway"))
        del gateway["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        assert probe_problems(gateway, port=8000, paths=GATEWAY_PATHS) == [
            "gateway/gateway: no readinessProbe"
        ]

    def test_a_probe_on_a_path_not_served_is_found(self) -> None:
        router = copy.deepcopy(role(render("base"), "router"))
        containers(router)[0]["livenessProbe"]["httpGet"]["path"] = "/healthz"
        assert probe_problems(router, port=8001, paths=ROUTER_PATHS) == [
            "router/router: livenessProbe path /healthz is not /health",
            "router/router: livenessProbe path /healthz is not served",
        ]

    def test_a_probe_on_another_port_is_found(self) -> None:
        router = copy.deepcopy(role(render("base"), "router"))
        assert "router/router: readinessProbe port http is not 9000" in probe_problems(
            router, port=9000, paths=ROUTER_PATHS
        )

    def test_a_missing_limit_is_found(self) -> None:
        gateway = copy.deepcopy(role(render("base"), "gateway"))
        del containers(gateway)[0]["resources"]["limits"]["memory"]
        assert resource_problems(gateway) == ["gateway/gateway: no memory limits"]

    def test_a_misspelt_variable_is_found(self) -> None:
        assert unknown(["EVENT_ROUTER_HTTP_PORTS", "REDIS_STREAMS_URL"]) == [
            "EVENT_ROUTER_HTTP_PORTS"
        ]

    def test_a_service_targeting_a_port_no_container_names_is_found(self) -> None:
        docs = copy.deepcopy(render("base"))
        find(docs, "Service", "router-metrics")["spec"]["ports"][0]["targetPort"] = "metrics"
        assert service_problems(docs) == [
            "Service router-metrics: port metrics is no port of router"
        ]

    def test_a_service_selecting_nothing_is_found(self) -> None:
        docs = copy.deepcopy(render("base"))
        find(docs, "Service", "gateway")["spec"]["selector"]["app.kubernetes.io/component"] = "x"
        assert service_problems(docs) == ["Service gateway selects no Deployment's pods"]


def test_the_known_variables_are_the_settings_env_names() -> None:
    names = known_variables()
    assert {"REDIS_STREAMS_URL", "REDIS_PUBSUB_URL", "EVENT_ROUTER_HTTP_PORT"} <= names
    assert "EVENT_ROUTER_REDIS_STREAMS_URL" not in names  # an alias replaces the prefixed name
    assert len(settings_variables()) == len(Settings.model_fields)


def test_uvicorn_reads_forwarded_allow_ips_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.0.0.0/8")
    config = server_config(None, Settings(), host="0.0.0.0", port=8000)
    assert config.forwarded_allow_ips == "10.0.0.0/8"


def test_the_base_image_tag_is_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for overlay in OVERLAYS:
        for deployment in eco_router_deployments(render(overlay)):
            assert containers(deployment)[0]["image"] == f"eco-router:{version}"


class TestDev:
    def test_one_redis_serves_both_roles_in_the_namespace(self) -> None:
        docs = render("dev")
        config = next(iter(of_kind(docs, "ConfigMap")))["data"]
        assert config["REDIS_STREAMS_URL"] == config["REDIS_PUBSUB_URL"] == "redis://redis:6379/0"
        service = find(docs, "Service", "redis")
        assert [p["port"] for p in service["spec"]["ports"]] == [6379]
        redis = find(docs, "Deployment", "redis")
        assert container_port(containers(redis)[0], "redis") == 6379
        assert service_problems(docs) == []

    def test_one_router_and_one_gateway(self) -> None:
        docs = render("dev")
        assert [role(docs, r)["spec"]["replicas"] for r in ROLES] == [1, 1]

    def test_the_gateway_starts_without_a_jwt_secret(self) -> None:
        gateway = containers(role(render("dev"), "gateway"))[0]
        (ref,) = [e for e in gateway["env"] if e["name"] == "EVENT_ROUTER_JWT_SECRET"]
        assert ref["valueFrom"]["secretKeyRef"]["optional"] is True
        assert command_of(role(render("dev"), "gateway")).demo is True


class TestProduction:
    def test_both_roles_find_their_masters_through_sentinels(self) -> None:
        config = next(iter(of_kind(render("production"), "ConfigMap")))["data"]
        streams = parse_redis_url(config["REDIS_STREAMS_URL"])
        pubsub = parse_redis_url(config["REDIS_PUBSUB_URL"])
        assert isinstance(streams, SentinelGroup)
        assert isinstance(pubsub, SentinelGroup)
        assert streams.sentinels == (("redis-streams-sentinel", 26379),)
        assert pubsub.sentinels == (("redis-pubsub-sentinel", 26379),)
        assert (
            (streams.master_name, streams.db) == (pubsub.master_name, pubsub.db) == ("mymaster", 0)
        )

    def test_keda_owns_both_counts_and_at_least_two_gateways_serve(self) -> None:
        docs = render("production")
        assert "replicas" not in role(docs, "router")["spec"]
        assert "replicas" not in role(docs, "gateway")["spec"]
        gateways = find(docs, "ScaledObject", "gateway")["spec"]
        assert (gateways["minReplicaCount"], gateways["maxReplicaCount"]) == (2, 3)
        assert role(render("base"), "router")["spec"]["replicas"] == 1

    def test_the_gateway_needs_its_jwt_secret(self) -> None:
        gateway = containers(role(render("production"), "gateway"))[0]
        (ref,) = [e for e in gateway["env"] if e["name"] == "EVENT_ROUTER_JWT_SECRET"]
        assert ref["valueFrom"]["secretKeyRef"]["optional"] is False

    def test_the_ingress_speaks_tls(self) -> None:
        ingress = find(render("production"), "Ingress", "gateway")
        assert ingress["spec"]["tls"][0]["secretName"] == "eco-router-tls"
        assert ingress["spec"]["tls"][0]["hosts"] == [r["host"] for r in ingress["spec"]["rules"]]
