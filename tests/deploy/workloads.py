"""Checks of rendered workloads, each returning the problems it found (empty: none)."""

from __future__ import annotations

from typing import Any

from tests.deploy.tools import Document, find, of_kind

Container = dict[str, Any]

# The value a fieldRef or secretKeyRef stands for when a container's environment is resolved.
SECRET_PLACEHOLDER = "s" * 40
POD_NAME_PLACEHOLDER = "router-5d9c7b8f6-x2x7q"


def containers(deployment: Document) -> list[Container]:
    return list(deployment["spec"]["template"]["spec"]["containers"])


def pod_spec(deployment: Document) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"])


def security_problems(deployment: Document, *, uid: int | None = None) -> list[str]:
    """The restricted settings on pod and containers; `uid`: the user the image runs as."""
    name = deployment["metadata"]["name"]
    pod = pod_spec(deployment)
    problems = []
    pod_context = pod.get("securityContext", {})
    if pod_context.get("runAsNonRoot") is not True:
        problems.append(f"{name}: pod runAsNonRoot is not true")
    if uid is not None and pod_context.get("runAsUser") != uid:
        problems.append(f"{name}: pod runAsUser {pod_context.get('runAsUser')} is not {uid}")
    if pod_context.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append(f"{name}: pod seccompProfile is not RuntimeDefault")
    for container in containers(deployment):
        where = f"{name}/{container['name']}"
        context = container.get("securityContext", {})
        expected = {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
        }
        for key, value in expected.items():
            if context.get(key) is not value:
                problems.append(f"{where}: {key} is not {value}")
        if uid is not None and context.get("runAsUser", pod_context.get("runAsUser")) != uid:
            problems.append(f"{where}: runAsUser is not {uid}")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            problems.append(f"{where}: capabilities do not drop ALL")
        if context.get("capabilities", {}).get("add"):
            problems.append(f"{where}: capabilities added")
        if context.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: seccompProfile is not RuntimeDefault")
    return problems


def tmp_problems(deployment: Document) -> list[str]:
    """Every container of the image gets /tmp from an emptyDir (the root is read-only)."""
    name = deployment["metadata"]["name"]
    empty_dirs = {v["name"] for v in pod_spec(deployment).get("volumes", []) if "emptyDir" in v}
    problems = []
    for container in containers(deployment):
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        if mounts.get("/tmp") not in empty_dirs:
            problems.append(f"{name}/{container['name']}: /tmp is not an emptyDir")
    return problems


def probe_problems(deployment: Document, *, port: int, paths: set[str]) -> list[str]:
    """Liveness on /health, readiness on /ready, over HTTP on `port`, paths the app serves."""
    name = deployment["metadata"]["name"]
    problems = []
    for container in containers(deployment):
        where = f"{name}/{container['name']}"
        expected = {"livenessProbe": "/health", "readinessProbe": "/ready"}
        for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(probe_name)
            if probe is None:
                if probe_name in expected:
                    problems.append(f"{where}: no {probe_name}")
                continue
            get = probe.get("httpGet")
            if get is None:
                problems.append(f"{where}: {probe_name} is not an HTTP GET")
                continue
            path = get.get("path")
            if probe_name in expected and path != expected[probe_name]:
                problems.append(f"{where}: {probe_name} path {path} is not {expected[probe_name]}")
            if path not in paths:
                problems.append(f"{where}: {probe_name} path {path} is not served")
            if container_port(container, get.get("port")) != port:
                problems.append(f"{where}: {probe_name} port {get.get('port')} is not {port}")
    return problems


def container_port(container: Container, port: object) -> int | None:
    """A probe's or a Service's port, by number or by the container's port name."""
    if isinstance(port, int):
        return port
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return int(declared["containerPort"])
    return None


def resource_problems(deployment: Document) -> list[str]:
    name = deployment["metadata"]["name"]
    problems = []
    for container in containers(deployment):
        resources = container.get("resources", {})
        for bound in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(bound, {}):
                    problems.append(f"{name}/{container['name']}: no {resource} {bound}")
        for resource in ("cpu", "memory"):
            request = quantity(resources.get("requests", {}).get(resource, "0"))
            limit = quantity(resources.get("limits", {}).get(resource, "0"))
            if limit and request > limit:
                problems.append(f"{name}/{container['name']}: {resource} request above limit")
    return problems


_SUFFIXES = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}


def quantity(text: object) -> float:
    """A Kubernetes quantity (`250m`, `1`, `256Mi`) as a number."""
    value = str(text)
    for suffix, factor in sorted(_SUFFIXES.items(), key=lambda item: -len(item[0])):
        if value.endswith(suffix):
            return float(value.removesuffix(suffix)) * factor
    return float(value)


def environment(docs: list[Document], container: Container) -> dict[str, str]:
    """The variables a container gets: ConfigMaps and Secrets (envFrom, in order) then env.

    A Secret the operator creates is not rendered: its keys are not known here, and the
    values of secretKeyRef and fieldRef entries stand in as placeholders.
    """
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(find(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = SECRET_PLACEHOLDER
        elif "fieldRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = POD_NAME_PLACEHOLDER
        else:
            env[entry["name"]] = ""
    return env


def secret_names(container: Container) -> set[str]:
    names = {s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s}
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            names.add(ref["name"])
    return names


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions, or plain labels) against labels."""
    match_labels = selector.get("matchLabels", {})
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        match_labels = selector
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def service_problems(docs: list[Document]) -> list[str]:
    """Every Service selects a Deployment's pods, and its target ports are ports they name."""
    problems = []
    deployments = of_kind(docs, "Deployment")
    for service in of_kind(docs, "Service"):
        name = service["metadata"]["name"]
        targets = [
            d
            for d in deployments
            if selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        if not targets:
            problems.append(f"Service {name} selects no Deployment's pods")
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for deployment in targets:
                if not any(container_port(c, target) for c in containers(deployment)):
                    problems.append(
                        f"Service {name}: port {target} is no port of "
                        f"{deployment['metadata']['name']}"
                    )
    return problems
