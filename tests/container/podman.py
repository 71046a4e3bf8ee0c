"""podman for the container tests: the project's containers.conf, and everything a test creates
removed again, whatever happened."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.deploy.tools import REPO

PODMAN_DIR = REPO / "deploy" / "podman"
CONTAINERS_CONF = PODMAN_DIR / "containers.conf"
# What `make stand-in-base` makes (deploy/podman/stand-in-base.sh).
STAND_IN_REDIS = "localhost/eco-router-redis:bookworm"
# How compose.yaml and the manifests run the image: read-only, /tmp the only writable path.
LOCKED_DOWN = (
    "--read-only",
    "--tmpfs=/tmp",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
)


def environment() -> dict[str, str]:
    """This process's environment with podman reading the project's containers.conf."""
    return {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF)),
    }


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Run podman; its stdout, or a failure that quotes what it said."""
    done = subprocess.run(
        ["podman", *args],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout


def free_port() -> int:
    """A loopback port free a moment ago, for podman to publish a container port on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def unique(name: str) -> str:
    """`name` made unique to this run, so parallel runs and leftovers never collide."""
    return f"eco-router-test-{name}-{uuid.uuid4().hex[:8]}"


class Sandbox:
    """The containers, networks and secrets one test created; `close` removes them all."""

    def __init__(self) -> None:
        self.containers: list[str] = []
        self.networks: list[str] = []
        self.secrets: list[str] = []
        self.kube_files: list[Path] = []

    def network(self, name: str) -> str:
        network = unique(name)
        podman("network", "create", network)
        self.networks.append(network)
        return network

    def run(self, name: str, image: str, options: list[str], command: list[str]) -> str:
        """Start a detached container with podman run's `options`; its unique name."""
        container = unique(name)
        self.containers.append(container)
        podman("run", "--detach", f"--name={container}", *options, image, *command)
        return container

    def secret(self, name: str, data: str) -> None:
        if name in podman("secret", "ls", "--format={{.Name}}").split():
            raise AssertionError(f"a podman secret named {name} exists already: not replacing it")
        self.secrets.append(name)
        subprocess.run(
            ["podman", "secret", "create", name, "-"],
            input=data,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )

    def play(self, manifest: Path, network: str) -> str:
        self.kube_files.append(manifest)
        return podman("kube", "play", f"--network={network}", str(manifest), timeout=180)

    def logs(self, container: str) -> str:
        done = subprocess.run(
            ["podman", "logs", "--tail=40", container],
            env=environment(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.stdout + done.stderr

    def close(self) -> None:
        for manifest in self.kube_files:
            podman("kube", "down", str(manifest), check=False)
        if self.containers:
            podman("rm", "--force", "--time=2", *self.containers, check=False)
        for secret in self.secrets:
            podman("secret", "rm", secret, check=False)
        for network in self.networks:
            podman("network", "rm", "--force", network, check=False)


@contextmanager
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox()
    try:
        yield box
    finally:
        box.close()


def wait_ready(url: str, *, timeout_s: float = 60, why: str = "") -> httpx.Response:
    """GET `url` until it answers 200; fails with the last answer (and `why`) at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=2, trust_env=False)
        except httpx.HTTPError as error:
            last = error
        else:
            if response.status_code == 200:
                return response
            last = f"{response.status_code} {response.text}"
        time.sleep(0.25)
    raise AssertionError(f"{url} not ready within {timeout_s} s: {last}\n{why}")
