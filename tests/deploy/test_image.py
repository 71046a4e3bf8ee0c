"""The Dockerfile: linted by hadolint, and declaring what the manifests and compose rely on."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.deploy.dockerfile import DOCKERFILE, read_image
from tests.deploy.tools import REPO, render, run_tool
from tests.deploy.workloads import containers

IMAGE = read_image()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_hadolint_finds_nothing() -> None:
    done = run_tool("hadolint", "--failure-threshold", "info", DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_finds_nothing_in_the_stand_in_redis_containerfile() -> None:
    containerfile = REPO / "deploy" / "podman" / "redis.Containerfile"
    done = run_tool("hadolint", "--failure-threshold", "info", containerfile)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_is_really_checking(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install redis\n")
    done = run_tool("hadolint", "--failure-threshold", "info", bad)
    assert done.returncode != 0
    assert "DL3007" in done.stdout  # the latest tag


def test_the_final_stage_is_slim_python_311_built_from_a_builder() -> None:
    assert IMAGE.base == "python:3.11-slim-bookworm"
    assert len(IMAGE.stages) == 2
    assert IMAGE.stages[0][0].value.endswith(" AS builder")
    assert any(i.value.startswith("--from=builder ") for i in IMAGE.final if i.name == "COPY")
    # No compiler or package installs in what runs.
    assert not any(
        word in i.value for i in IMAGE.final if i.name == "RUN" for word in ("apt-get", "pip ")
    )


def test_one_image_for_both_roles_the_router_by_default() -> None:
    assert IMAGE.exec_form("ENTRYPOINT") == ["eco-router"]
    assert "eco-router" in PYPROJECT["project"]["scripts"]
    assert IMAGE.exec_form("CMD") == ["worker"]
    assert IMAGE.values("HEALTHCHECK") == []


def test_it_runs_as_the_numeric_user_the_manifests_name() -> None:
    uid, gid = IMAGE.user
    assert uid >= 10000
    assert gid == uid
    for overlay in ("base", "dev", "production"):
        for name in ("router", "gateway"):
            deployment = next(
                d
                for d in render(overlay)
                if d["kind"] == "Deployment" and d["metadata"]["name"] == name
            )
            pod = deployment["spec"]["template"]["spec"]["securityContext"]
            assert (pod["runAsUser"], pod["runAsGroup"]) == (uid, gid)


def test_it_exposes_exactly_the_ports_the_manifests_use() -> None:
    ports = {
        p["containerPort"]
        for d in render("base")
        if d["kind"] == "Deployment"
        for c in containers(d)
        for p in c["ports"]
    }
    assert IMAGE.exposed == ports == {8000, 8001}


def test_it_never_writes_byte_code_and_is_labelled() -> None:
    env = " ".join(IMAGE.values("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    labels = " ".join(IMAGE.values("LABEL"))
    for key in ("title", "description", "version", "revision", "created"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_the_build_context_holds_what_the_package_needs_and_nothing_else() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    kept = {line.removeprefix("!").rstrip("/") for line in lines if line.startswith("!")}
    assert kept == {
        "pyproject.toml",
        PYPROJECT["project"]["readme"],
        "src",
        "requirements/run.lock",
    }
    copied = {
        part.rstrip("/")
        for i in IMAGE.stages[0]
        if i.name == "COPY"
        for part in i.value.split()[:-1]
    }
    assert copied <= kept


def _fake_engine(directory: Path, name: str, *, answers: bool) -> Path:
    script = directory / name
    log = directory / f"{name}.log"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        f'if [ "$1" = info ]; then exit {0 if answers else 1}; fi\n'
        "exit 0\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return log


def _make_image(
    tmp_path: Path,
    engine: str,
    *variables: str,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed")
    env = {**os.environ, **(env or {}), "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [make, "--no-print-directory", "image", f"ENGINE={engine}", *variables],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_make_image_says_so_when_no_engine_answers(tmp_path: Path) -> None:
    log = _fake_engine(tmp_path, "silent-engine", answers=False)
    done = _make_image(tmp_path, "silent-engine")
    assert done.returncode != 0
    assert "no container engine is available" in done.stderr
    assert log.read_text() == "info\n"  # asked, never told to build


def test_make_image_builds_with_the_engine_that_answers(tmp_path: Path) -> None:
    log = _fake_engine(tmp_path, "fake-engine", answers=True)
    done = _make_image(tmp_path, "fake-engine")
    assert done.returncode == 0, done.stderr
    info, build = log.read_text().splitlines()
    version = PYPROJECT["project"]["version"]
    assert info == "info"
    assert build.startswith(f"build --tag eco-router:{version} --build-arg VERSION={version} ")
    assert build.endswith(" .")


def test_make_image_with_podman_lends_the_machines_pip_settings_to_the_build(
    tmp_path: Path,
) -> None:
    log = _fake_engine(tmp_path, "podman", answers=True)
    bundle = tmp_path / "proxy-ca.pem"
    bundle.write_text("a CA bundle\n")
    done = _make_image(
        tmp_path, "podman", "PYTHON_IMAGE=localhost/some-base:1", env={"PIP_CERT": str(bundle)}
    )
    assert done.returncode == 0, done.stderr
    _, build = log.read_text().splitlines()
    assert " --build-arg PYTHON_IMAGE=localhost/some-base:1 " in build
    # Mounted for the build's RUN steps (the builder stage's pip), not copied into the image.
    assert " --build-arg=PIP_CONFIG_FILE=/mnt/pip.conf " in build
    assert f" --volume={bundle}:/mnt/" in build
    assert all(option.endswith(":ro") for option in build.split() if option.startswith("--volume="))


def test_make_image_with_podman_lends_the_machines_pip_constraints_to_the_build(
    tmp_path: Path,
) -> None:
    log = _fake_engine(tmp_path, "podman", answers=True)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("redis<9\n")
    done = _make_image(tmp_path, "podman", env={"PIP_CONSTRAINT": str(constraints)})
    assert done.returncode == 0, done.stderr
    _, build = log.read_text().splitlines()
    # A constraint file the build cannot open stops its pip install.
    assert f" --volume={constraints}:/mnt/" in build


def test_make_image_stand_in_builds_on_the_base_made_from_debian_packages() -> None:
    done = subprocess.run(
        ["make", "--dry-run", "--no-print-directory", "image", "STAND_IN=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "deploy/podman/stand-in-base.sh" in done.stdout
    assert "--build-arg PYTHON_IMAGE=localhost/eco-router-base:bookworm" in done.stdout
    # The stand-in base lives in podman's storage: docker is not asked.
    assert "for candidate in podman;" in done.stdout


def test_make_image_names_one_revision_in_a_tree_without_commits(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tree / name)
    subprocess.run(["git", "init", "-q", str(tree)], check=True, timeout=30)
    log = _fake_engine(tmp_path, "fake-engine", answers=True)
    done = _make_image(tmp_path, "fake-engine", cwd=tree)
    assert done.returncode == 0, done.stderr
    _, build = log.read_text().splitlines()
    assert " --build-arg REVISION=unknown " in build
