"""Every kustomization renders with kubectl, and every document it renders is schema-valid."""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy import schemas
from tests.deploy.tools import KUSTOMIZATIONS, Document, find, render, run_tool, venv_tool


def test_kubectl_is_the_virtualenvs_own() -> None:
    kubectl = venv_tool("kubectl")
    assert kubectl.parent.name == "bin"
    assert ".venv" in kubectl.parts or kubectl.parent.parent.joinpath("pyvenv.cfg").is_file()
    done = run_tool("kubectl", "version", "--client")
    assert done.returncode == 0, done.stderr
    assert "Kustomize Version" in done.stdout


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_kustomization_renders(name: str) -> None:
    docs = render(name)
    assert docs, f"{name} rendered nothing"
    assert all("kind" in d and d["metadata"].get("name") for d in docs)


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_rendered_document_is_valid_for_its_kind(name: str) -> None:
    for doc in render(name):
        schemas.validate(doc)


@pytest.mark.parametrize("name", ["base", "dev", "production"])
def test_everything_lands_in_the_eco_router_namespace(name: str) -> None:
    for doc in render(name):
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == "eco-router"
        else:
            assert doc["metadata"].get("namespace") == "eco-router", doc["metadata"]["name"]


# One small valid object per vendored custom resource schema (none is in the kit itself yet).
VALID_CUSTOM_RESOURCES: list[Document] = [
    {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "router", "namespace": "eco-router"},
        "spec": {
            "scaleTargetRef": {"name": "router"},
            "minReplicaCount": 1,
            "maxReplicaCount": 4,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": "http://prometheus.monitoring:9090",
                        "query": "sum(event_router_stream_lag)",
                        "threshold": "1000",
                    },
                }
            ],
        },
    },
    {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": {"name": "prometheus"},
        "spec": {"secretTargetRef": [{"parameter": "bearerToken", "name": "s", "key": "k"}]},
    },
    {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "router", "labels": {"release": "prometheus"}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/component": "router"}},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    },
    {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "router"},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/component": "router"}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
        },
    },
    {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "eco-router"},
        "spec": {
            "groups": [
                {
                    "name": "eco-router",
                    "rules": [{"alert": "RouterDown", "expr": "up == 0", "for": "5m"}],
                }
            ]
        },
    },
]


class TestValidator:
    """The validator refuses what the API server would."""

    def test_an_unknown_kind_fails(self) -> None:
        doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        with pytest.raises(schemas.UnknownKind):
            schemas.validate(doc)

    def test_a_deployment_field_of_the_wrong_type_fails(self) -> None:
        doc = copy.deepcopy(find(render("base"), "Deployment", "router"))
        doc["spec"]["replicas"] = "two"
        with pytest.raises(kubernetes_validate.ValidationError):
            schemas.validate(doc)

    def test_a_misspelt_deployment_field_fails(self) -> None:
        doc = copy.deepcopy(find(render("base"), "Deployment", "gateway"))
        doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
        with pytest.raises(kubernetes_validate.ValidationError):
            schemas.validate(doc)

    @pytest.mark.parametrize("doc", [pytest.param(d, id=d["kind"]) for d in VALID_CUSTOM_RESOURCES])
    def test_the_vendored_custom_resource_schemas_accept_a_valid_object(
        self, doc: Document
    ) -> None:
        schemas.validate(doc)

    def test_a_scaled_object_without_its_target_fails(self) -> None:
        doc = {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "router"},
            "spec": {"triggers": [{"type": "cpu", "metadata": {"value": "50"}}]},
        }
        with pytest.raises(jsonschema.ValidationError, match="scaleTargetRef"):
            schemas.validate(doc)

    def test_a_misspelt_custom_resource_field_fails(self) -> None:
        doc = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "router"},
            "spec": {
                "selector": {},
                "endpoints": [{"port": "http", "intervall": "15s"}],
            },
        }
        with pytest.raises(jsonschema.ValidationError, match="intervall"):
            schemas.validate(doc)

    def test_a_custom_resource_of_an_unvendored_version_is_unknown(self) -> None:
        doc = {"apiVersion": "keda.sh/v1beta9", "kind": "ScaledObject", "metadata": {"name": "x"}}
        with pytest.raises(schemas.UnknownKind):
            schemas.validate(doc)
