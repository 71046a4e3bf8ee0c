"""What a set of NetworkPolicies allows, evaluated as the Kubernetes API defines it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.deploy.tools import Document, of_kind
from tests.deploy.workloads import selects


@dataclass(frozen=True)
class Pod:
    """A pod as policies see it: its namespace's labels and its own."""

    namespace: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def allowed(
    docs: list[Document], *, source: Pod, destination: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """Whether a connection from `source` to `destination` on `port` passes both ends'
    policies: the source's egress and the destination's ingress."""
    return _passes(docs, source, "Egress", destination, port, protocol) and _passes(
        docs, destination, "Ingress", source, port, protocol
    )


def _passes(
    docs: list[Document], pod: Pod, direction: str, peer: Pod, port: int, protocol: str
) -> bool:
    relevant = [
        p
        for p in of_kind(docs, "NetworkPolicy")
        if p["metadata"].get("namespace") == pod.namespace
        and selects(p["spec"]["podSelector"], pod.labels)
        and direction in _policy_types(p)
    ]
    if not relevant:
        return True  # a pod no policy selects is not isolated
    key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    for policy in relevant:
        for rule in policy["spec"].get(key, []):
            if _ports_match(rule.get("ports"), port, protocol) and _peers_match(
                rule.get(peers_key), peer, policy["metadata"]["namespace"]
            ):
                return True
    return False


def _policy_types(policy: Document) -> list[str]:
    types = policy["spec"].get("policyTypes")
    if types:
        return list(types)
    return ["Ingress", "Egress"] if "egress" in policy["spec"] else ["Ingress"]


def _ports_match(ports: list[dict[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    return any(
        p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports
    )


def _peers_match(peers: list[dict[str, Any]] | None, peer: Pod, namespace: str) -> bool:
    if not peers:
        return True
    for rule in peers:
        if "ipBlock" in rule:
            continue
        namespace_selector = rule.get("namespaceSelector")
        pod_selector = rule.get("podSelector")
        if namespace_selector is None:
            in_namespace = peer.namespace == namespace
        else:
            in_namespace = selects(namespace_selector, peer.namespace_labels)
        if in_namespace and (pod_selector is None or selects(pod_selector, peer.labels)):
            return True
    return False
