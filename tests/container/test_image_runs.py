"""The image built and run with podman: alone, as a pipeline of containers, and as the dev overlay.

Built on the stand-in base (Debian's python3, deploy/podman/stand-in-base.sh) where no registry
is reachable; see docs/DEPLOYING.md for what this verifies and what only a cluster can.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import tomllib
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio
import yaml

from eco_router.domain.progress import DEFAULT_STAGES
from eco_router.producer import publish_stage_event_async
from tests.container.podman import (
    LOCKED_DOWN,
    STAND_IN_REDIS,
    free_port,
    podman,
    sandbox,
    unique,
    wait_ready,
)
from tests.deploy.dockerfile import read_image
from tests.deploy.tools import REPO, Document, find, render
from tests.integration.sse_client import open_sse, sse_client

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
UID, GID = read_image().user
# What the image's own python reports from inside a locked-down container.
PROBE = """
import os, pathlib
def writable(path):
    try:
        (pathlib.Path(path) / "probe").write_text("x")
        return True
    except OSError:
        return False
print(os.getuid(), os.getgid(), writable("/"), writable("/opt/eco-router"), writable("/tmp"))
print(sorted(os.listdir("/mnt")), os.path.exists("/etc/pip.conf"), "PIP_CONFIG_FILE" in os.environ)
"""


class TestTheImageAlone:
    def test_it_answers_version_read_only_as_its_numeric_user(self, image: str) -> None:
        version = podman("run", "--rm", *LOCKED_DOWN, image, "--version")
        assert version.strip() == f"eco-router {VERSION}"
        assert podman("image", "inspect", "--format={{.Config.User}}", image).strip() == (
            f"{UID}:{GID}"
        )
        ids_and_writes, leftovers = (
            podman("run", "--rm", *LOCKED_DOWN, "--entrypoint=python", image, "-c", PROBE)
            .strip()
            .splitlines()
        )
        # Only the tmpfs is writable; the root filesystem and the virtualenv are not.
        assert ids_and_writes == f"{UID} {GID} False False True"
        # The build machine's pip settings were lent to the builder stage, never kept.
        assert leftovers == "[] False False"

    def test_it_is_labelled_with_its_version_revision_and_base(self, image: str) -> None:
        labels = json.loads(podman("image", "inspect", "--format={{json .Labels}}", image))
        assert labels["org.opencontainers.image.version"] == VERSION
        assert re.fullmatch(r"[0-9a-f]{40}", labels["org.opencontainers.image.revision"])
        assert labels["org.opencontainers.image.base.name"] == "localhost/eco-router-base:bookworm"


def _inspect(container: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A running container's Config and HostConfig, as podman reports them."""
    [found] = json.loads(podman("inspect", container))
    return found["Config"], found["HostConfig"]


def _gateway_args() -> list[str]:
    """The gateway's command as the manifests run it."""
    [container] = find(render("base"), "Deployment", "gateway")["spec"]["template"]["spec"][
        "containers"
    ]
    return list(container["args"])


async def _publish_job(redis_url: str, job: str) -> list[tuple[str, str]]:
    """One job through every stage with the producer SDK; the (event, status) pairs sent."""
    client = redis.asyncio.Redis.from_url(redis_url)
    sent = []
    try:
        for number, stage in enumerate(DEFAULT_STAGES):
            for status, progress in (("started", number * 25), ("completed", (number + 1) * 25)):
                await publish_stage_event_async(
                    client, job, stage, status, progress=progress, domain="scan", shards=4
                )
                sent.append((stage, status))
        await publish_stage_event_async(
            client, job, "done", "completed", result={"ok": True}, domain="scan", shards=4
        )
        sent.append(("done", "completed"))
    finally:
        await client.aclose()
    return sent


async def test_a_job_published_into_the_containers_redis_reaches_a_viewer_in_order(
    image: str,
) -> None:
    redis_port, router_port, gateway_port = free_port(), free_port(), free_port()
    with sandbox() as box:
        network = box.network("net")
        redis_name = box.run(
            "redis",
            STAND_IN_REDIS,
            [
                f"--network={network}",
                *LOCKED_DOWN,
                "--tmpfs=/data",
                f"--publish=127.0.0.1:{redis_port}:6379",
            ],
            [],
        )
        url = f"redis://{redis_name}:6379/0"
        settings = [
            f"--env=REDIS_STREAMS_URL={url}",
            f"--env=REDIS_PUBSUB_URL={url}",
            "--env=EVENT_ROUTER_STREAMS=scan:events=4",
        ]
        router = box.run(
            "router",
            image,
            [
                f"--network={network}",
                *LOCKED_DOWN,
                *settings,
                "--env=EVENT_ROUTER_HTTP_HOST=0.0.0.0",
                "--env=EVENT_ROUTER_HTTP_PORT=8001",
                f"--publish=127.0.0.1:{router_port}:8001",
            ],
            ["worker"],
        )
        gateway = box.run(
            "gateway",
            image,
            [
                f"--network={network}",
                *LOCKED_DOWN,
                *settings,
                f"--publish=127.0.0.1:{gateway_port}:8000",
            ],
            _gateway_args(),
        )
        for name, port in ((router, router_port), (gateway, gateway_port)):
            await asyncio.to_thread(
                wait_ready, f"http://127.0.0.1:{port}/ready", why=box.logs(name)
            )
        for name in (redis_name, router, gateway):
            config, host = _inspect(name)
            assert host["ReadonlyRootfs"]
            assert config["User"] in (f"{UID}:{GID}", "999:999")  # Redis: as redis:7.2 runs

        job = f"job-{uuid.uuid4().hex[:8]}"
        async with (
            sse_client(f"http://127.0.0.1:{gateway_port}") as http,
            open_sse(http, f"/api/v1/scan/{job}/events") as stream,
        ):
            assert stream.status_code == 200
            [snapshot] = await stream.read(1)
            assert (snapshot.event, snapshot.json()["state"]) == ("snapshot", None)
            sent = await _publish_job(f"redis://127.0.0.1:{redis_port}/0", job)
            events = await stream.read_to_end(timeout_s=30)

        assert [(e.event, e.json()["status"]) for e in events] == sent, box.logs(router)
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        assert stream.ended


# The dev overlay's workloads; the rest (Services, PDBs, NetworkPolicies, KEDA, monitoring,
# Ingress) means nothing to podman.
PLAYED_DEPLOYMENTS = ("gateway", "router")


def _played(docs: list[Document], image: str, ports: dict[str, int], run: str) -> list[Document]:
    """The dev overlay as podman 4.3 can play it, changed only where podman differs:

    - its Redis Deployment becomes a Pod named like the Service: podman has no Services, and a
      pod on a network with the dnsname plugin is found by its name, which a Deployment's
      pods (`redis-pod-0`) are not;
    - every container port gets a hostPort on 127.0.0.1: podman publishes container ports on
      the host by themselves, on every address, where something may already listen;
    - emptyDir volumes get names of their own pod and run: podman makes them named volumes,
      shared by every pod that names one alike;
    - the images are the one built here and the stand-in Redis.
    """
    played = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("eco-router-config")
    ]
    for name in (*PLAYED_DEPLOYMENTS, "redis"):
        deployment = find(docs, "Deployment", name)
        template = deployment["spec"]["template"]
        spec: dict[str, Any] = template["spec"]
        for volume in spec.get("volumes", []):
            own = f"{run}-{name}-{volume['name']}"
            for container in spec["containers"]:
                for mount in container.get("volumeMounts", []):
                    if mount["name"] == volume["name"]:
                        mount["name"] = own
            volume["name"] = own
        for container in spec["containers"]:
            container["image"] = STAND_IN_REDIS if name == "redis" else image
            for port in container["ports"]:
                port["hostIP"] = "127.0.0.1"
                port["hostPort"] = ports[name]
        if name == "redis":
            deployment = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "redis",
                    "namespace": deployment["metadata"]["namespace"],
                    "labels": template["metadata"]["labels"],
                },
                "spec": spec,
            }
        played.append(deployment)
    return played


def test_the_dev_overlay_played_by_podman_is_ready(image: str, tmp_path: Path) -> None:
    ports = {"gateway": free_port(), "router": free_port(), "redis": free_port()}
    run = unique("kube")
    manifest = tmp_path / "dev.yaml"
    manifest.write_text(yaml.safe_dump_all(_played(render("dev"), image, ports, run)))
    with sandbox() as box:
        network = box.network("kube")
        # The Secret the overlay reads with envFrom. podman 4.3 plays a Secret document into a
        # secret its own secretRef lookup cannot read, so it is made in the form podman reads:
        # a JSON map of base64 values.
        jwt_secret = uuid.uuid4().hex * 2
        box.secret(
            "eco-router-secrets",
            json.dumps({"EVENT_ROUTER_JWT_SECRET": base64.b64encode(jwt_secret.encode()).decode()}),
        )
        box.play(manifest, network)
        containers = {name: f"{name}-pod-0-{name}" for name in PLAYED_DEPLOYMENTS}
        for name in PLAYED_DEPLOYMENTS:
            wait_ready(f"http://127.0.0.1:{ports[name]}/ready", why=box.logs(containers[name]))
        # The Deployments' security contexts and limits, as podman applied them.
        for name, container in containers.items():
            config, host = _inspect(container)
            [declared] = find(render("dev"), "Deployment", name)["spec"]["template"]["spec"][
                "containers"
            ]
            memory = declared["resources"]["limits"]["memory"]
            assert config["User"] == f"{UID}:{GID}"
            assert host["ReadonlyRootfs"]
            assert "no-new-privileges" in host["SecurityOpt"]
            assert host["Memory"] == int(memory.removesuffix("Mi")) * 2**20
        # The Secret reached the gateway: its streams now ask for a token.
        refused = httpx.get(
            f"http://127.0.0.1:{ports['gateway']}/api/v1/scan/job-1/events",
            timeout=5,
            trust_env=False,
        )
        assert refused.status_code == 401
