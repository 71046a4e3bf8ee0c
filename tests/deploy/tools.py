"""The real tools the kit is checked with, taken from this virtualenv, and rendering with them."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"

# Every kustomization the kit ships; each must render on its own.
KUSTOMIZATIONS = {
    "base": KUBERNETES / "base",
    "dev": KUBERNETES / "overlays" / "dev",
    "production": KUBERNETES / "overlays" / "production",
    "keda-to-prometheus": KUBERNETES / "cluster" / "keda-to-prometheus",
}

Document = dict[str, Any]


def venv_tool(name: str) -> Path:
    """A binary the test extra installs beside this interpreter (never one from /usr/bin)."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: install the test extra (make venv-test)")
    return path


def run_tool(name: str, *args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv_tool(name)), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@functools.cache
def _rendered(directory: Path) -> str:
    done = run_tool("kubectl", "kustomize", directory)
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return done.stdout


def render(name: str) -> list[Document]:
    """The documents `kubectl kustomize` renders for one of `KUSTOMIZATIONS` (fresh copies)."""
    return [doc for doc in yaml.safe_load_all(_rendered(KUSTOMIZATIONS[name])) if doc]


def find(docs: list[Document], kind: str, name: str) -> Document:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    if len(matches) != 1:
        raise AssertionError(f"expected one {kind} {name}, found {len(matches)}")
    return matches[0]


def of_kind(docs: list[Document], kind: str) -> list[Document]:
    return [d for d in docs if d["kind"] == kind]
