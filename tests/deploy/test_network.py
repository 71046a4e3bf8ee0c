"""NetworkPolicies and the Ingress: who may talk to whom, and SSE through ingress-nginx."""

from __future__ import annotations

import copy

import pytest
from fastapi.routing import APIRoute

from eco_router.entrypoints.http import sse_routes
from eco_router.entrypoints.http.sse_responses import SSE_HEADERS
from tests.deploy.policies import Pod, allowed
from tests.deploy.tools import Document, find, render

NAMESPACE = "eco-router"
ROUTER = Pod(
    NAMESPACE, {"app.kubernetes.io/name": "eco-router", "app.kubernetes.io/component": "router"}
)
GATEWAY = Pod(
    NAMESPACE, {"app.kubernetes.io/name": "eco-router", "app.kubernetes.io/component": "gateway"}
)
REDIS_ELSEWHERE = Pod("redis", {"app.kubernetes.io/name": "redis"})
DNS = Pod("kube-system", {"k8s-app": "kube-dns"})
INGRESS_NGINX = Pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
STRANGER = Pod("default", {"app": "curl"})
KEDA = Pod("keda", {"app.kubernetes.io/name": "keda-operator"})

OVERLAYS = ["base", "dev", "production"]


@pytest.mark.parametrize("overlay", OVERLAYS)
class TestPolicies:
    def test_the_namespace_denies_by_default(self, overlay: str) -> None:
        policy = find(render(overlay), "NetworkPolicy", "default-deny")
        assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}

    @pytest.mark.parametrize("pod", [ROUTER, GATEWAY], ids=["router", "gateway"])
    def test_both_roles_reach_redis_sentinels_and_dns(self, overlay: str, pod: Pod) -> None:
        docs = render(overlay)
        open_redis = [*docs, _open_ingress(REDIS_ELSEWHERE)]
        for port in (6379, 26379):
            assert allowed(open_redis, source=pod, destination=REDIS_ELSEWHERE, port=port)
        assert allowed(docs, source=pod, destination=DNS, port=53, protocol="UDP")
        assert allowed(docs, source=pod, destination=DNS, port=53)
        assert not allowed(open_redis, source=pod, destination=REDIS_ELSEWHERE, port=443)

    def test_only_the_ingress_controller_and_prometheus_reach_the_gateway(
        self, overlay: str
    ) -> None:
        docs = render(overlay)
        assert allowed(docs, source=INGRESS_NGINX, destination=GATEWAY, port=8000)
        assert allowed(docs, source=PROMETHEUS, destination=GATEWAY, port=8000)
        assert not allowed(docs, source=STRANGER, destination=GATEWAY, port=8000)
        assert not allowed(docs, source=ROUTER, destination=GATEWAY, port=8000)

    def test_only_prometheus_reaches_the_routers_metrics(self, overlay: str) -> None:
        docs = render(overlay)
        assert allowed(docs, source=PROMETHEUS, destination=ROUTER, port=8001)
        assert not allowed(docs, source=INGRESS_NGINX, destination=ROUTER, port=8001)
        assert not allowed(docs, source=STRANGER, destination=ROUTER, port=8001)


def test_the_dev_redis_admits_the_two_roles_only() -> None:
    docs = render("dev")
    redis = Pod(
        NAMESPACE, {"app.kubernetes.io/name": "eco-router", "app.kubernetes.io/component": "redis"}
    )
    assert allowed(docs, source=ROUTER, destination=redis, port=6379)
    assert allowed(docs, source=GATEWAY, destination=redis, port=6379)
    assert not allowed(docs, source=STRANGER, destination=redis, port=6379)


def test_the_keda_operator_may_query_prometheus() -> None:
    docs = render("keda-to-prometheus")
    egress_denied = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny", "namespace": "keda"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    }
    docs = [*docs, egress_denied]
    assert allowed(docs, source=KEDA, destination=PROMETHEUS, port=9090)
    assert not allowed(docs, source=KEDA, destination=PROMETHEUS, port=9091)
    assert not allowed(docs, source=KEDA, destination=STRANGER, port=9090)


def test_without_the_dns_policy_names_do_not_resolve() -> None:
    docs = [d for d in copy.deepcopy(render("base")) if d["metadata"]["name"] != "allow-dns"]
    assert not allowed(docs, source=ROUTER, destination=DNS, port=53, protocol="UDP")


def test_the_gateway_stays_open_without_the_default_deny_but_not_to_strangers() -> None:
    # The gateway's own ingress policy isolates it even without default-deny; the router's
    # port is open to everyone then, which is what default-deny is for.
    docs = [d for d in copy.deepcopy(render("base")) if d["metadata"]["name"] != "default-deny"]
    assert not allowed(docs, source=STRANGER, destination=GATEWAY, port=8000)
    docs = [d for d in docs if d["metadata"]["name"] != "metrics-from-prometheus"]
    assert allowed(docs, source=STRANGER, destination=ROUTER, port=8001)


def _open_ingress(pod: Pod) -> Document:
    """A Redis in another namespace accepts everyone: only the eco-router side is tested."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "open", "namespace": pod.namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]},
    }


class TestIngress:
    def test_the_sse_path_goes_to_the_gateways_http_port(self) -> None:
        docs = render("production")
        ingress = find(docs, "Ingress", "gateway")
        (rule,) = ingress["spec"]["rules"]
        (path,) = rule["http"]["paths"]
        assert (path["path"], path["pathType"]) == ("/api/v1", "Prefix")
        backend = path["backend"]["service"]
        service = find(docs, "Service", backend["name"])
        assert backend["port"]["name"] in [p["name"] for p in service["spec"]["ports"]]
        sse_paths = [r.path for r in sse_routes.router.routes if isinstance(r, APIRoute)]
        assert "/api/v1/{domain}/{job_id}/events" in sse_paths
        assert "/api/v1/{domain}/{job_id}/events".startswith(path["path"] + "/")
        # /metrics, /health and /ready are not published.
        assert not any(p.startswith(path["path"]) for p in ("/metrics", "/health", "/ready"))

    def test_nginx_neither_buffers_nor_cuts_a_stream(self) -> None:
        annotations = find(render("base"), "Ingress", "gateway")["metadata"]["annotations"]
        prefix = "nginx.ingress.kubernetes.io/"
        assert annotations[prefix + "proxy-buffering"] == "off"
        assert annotations[prefix + "proxy-request-buffering"] == "off"
        assert int(annotations[prefix + "proxy-read-timeout"]) >= 3600
        assert int(annotations[prefix + "proxy-send-timeout"]) >= 3600
        assert find(render("base"), "Ingress", "gateway")["spec"]["ingressClassName"] == "nginx"

    def test_the_gateway_itself_asks_proxies_not_to_buffer(self) -> None:
        assert SSE_HEADERS["X-Accel-Buffering"] == "no"
