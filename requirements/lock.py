"""The lock files: written by `make lock` with uv, checked against pyproject.toml offline.

`python requirements/lock.py --uv PATH` resolves pyproject.toml's dependencies (run.lock) and
those with the test extra (test.lock) for the image's platform, with every file's hash, and heads
each lock with a digest of the specs it was made from. `problems()` says why a lock no longer
answers pyproject.toml; tests/deploy/test_locks.py runs it in `make test`. It reads the specs and
the lock only, so it needs neither uv nor the network, and a new release on the index does not
make a lock out of date: only a change to pyproject.toml's dependencies does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# What the image (python:3.11-slim-bookworm) and CI (Debian bookworm) run on.
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
# The environment pyproject.toml's markers are evaluated in (packaging's marker names).
ENVIRONMENT = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


@dataclass(frozen=True, slots=True)
class Lock:
    """One lock file: its name, and the extras of pyproject.toml it is made with."""

    name: str
    extras: tuple[str, ...]

    @property
    def path(self) -> Path:
        return HERE / self.name


RUN = Lock("run.lock", ())
# The test extra stands for the run dependencies too, as `make venv-test` does.
TEST = Lock("test.lock", ("test",))
LOCKS = (RUN, TEST)

DIGEST_LINE = re.compile(r"^# pyproject\.toml's dependencies, sha256: ([0-9a-f]{64})$", re.M)
PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.M)
# uv's annotation for what pyproject.toml asks for by name.
DIRECT = "eco-router (pyproject.toml)"


def normalize(name: str) -> str:
    """A distribution name as indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def specs(pyproject: Path, extras: tuple[str, ...]) -> list[str]:
    """The requirement strings a lock with `extras` is made from, in pyproject.toml's order."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    return [*project.get("dependencies", []), *(r for e in extras for r in optional.get(e, []))]


def digest(pyproject: Path, lock: Lock) -> str:
    """A hash of what the lock is resolved from: the specs, requires-python and the target.

    Whitespace inside a spec and the order of the lists do not count; comments are not read.
    """
    project = tomllib.loads(pyproject.read_text())["project"]
    made_from = {
        "requires-python": project.get("requires-python", ""),
        "specs": sorted("".join(spec.split()) for spec in specs(pyproject, lock.extras)),
        "target": [PYTHON_VERSION, PLATFORM],
    }
    return hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()


def pins(text: str) -> dict[str, str]:
    """Each locked distribution's version, by normalized name."""
    return {normalize(name): version for name, version in PIN_LINE.findall(text)}


def asked_by_name(text: str) -> set[str]:
    """The distributions uv annotated as asked for by pyproject.toml itself."""
    found: set[str] = set()
    name = ""
    for line in text.splitlines():
        if pin := PIN_LINE.match(line):
            name = normalize(pin.group(1))
        elif line.strip().lstrip("#").strip().removeprefix("via ").strip() == DIRECT:
            found.add(name)
    return found


def problems(pyproject: Path, lock: Lock, lock_path: Path | None = None) -> list[str]:
    """Why the lock does not answer pyproject.toml's specs (empty when it does)."""
    # packaging comes with the test extra (pytest needs it); `make lock` never imports it.
    from packaging.requirements import Requirement

    path = lock_path or lock.path
    if not path.is_file():
        return [f"{path.name} is missing: run `make lock`"]
    text = path.read_text()
    found: list[str] = []
    recorded = DIGEST_LINE.search(text)
    if recorded is None:
        found.append(f"{path.name} records no digest of pyproject.toml's dependencies")
    elif recorded.group(1) != digest(pyproject, lock):
        found.append(f"{path.name} was made from other dependency specs than pyproject.toml's")
    locked = pins(text)
    project = normalize(tomllib.loads(pyproject.read_text())["project"]["name"])
    wanted: set[str] = set()
    for spec in specs(pyproject, lock.extras):
        requirement = Requirement(spec)
        name = normalize(requirement.name)
        if name == project:
            continue  # the project naming one of its own extras
        if requirement.marker is not None and not requirement.marker.evaluate(ENVIRONMENT):
            continue
        wanted.add(name)
        if name not in locked:
            found.append(f"{spec!r} is not in {path.name}")
        elif not requirement.specifier.contains(locked[name], prereleases=True):
            found.append(f"{path.name} has {name}=={locked[name]}, outside {spec!r}")
    for name in sorted(asked_by_name(text) - wanted):
        found.append(f"{path.name} has {name} for pyproject.toml, which no longer asks for it")
    if found:
        found.append("run `make lock`")
    return found


def _compile(
    uv: Path, pyproject: Path, lock: Lock, *, constraints: Lock | None, upgrade: bool
) -> str:
    # uv keeps the versions the output file already pins while they still fit, so a new
    # dependency moves no other; --upgrade takes the newest of everything.
    command = [
        str(uv),
        "pip",
        "compile",
        "--no-config",
        "--quiet",
        "--generate-hashes",
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        PLATFORM,
        "--custom-compile-command",
        "make lock",
        *(f"--extra={extra}" for extra in lock.extras),
        *(["--constraints", str(constraints.path.relative_to(REPO))] if constraints else []),
        *(["--upgrade"] if upgrade else []),
        "--output-file",
        str(lock.path.relative_to(REPO)),
        str(pyproject.relative_to(REPO)),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return lock.path.read_text()


def write(uv: Path, *, upgrade: bool, pyproject: Path = REPO / "pyproject.toml") -> None:
    """Resolve both locks from pyproject.toml. The run lock is constrained by the test lock, so
    what the image runs is what `make test` tested."""
    version = subprocess.run(
        [str(uv), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    for lock, constraints in ((TEST, None), (RUN, TEST)):
        text = _compile(uv, pyproject, lock, constraints=constraints, upgrade=upgrade)
        header = (
            f"# Made by `make lock` (uv {version}) for Python {PYTHON_VERSION} on {PLATFORM};\n"
            f"# tests/deploy/test_locks.py checks it against pyproject.toml.\n"
            f"# pyproject.toml's dependencies, sha256: {digest(pyproject, lock)}\n"
        )
        lock.path.write_text(header + text)
        print(f"{lock.path.relative_to(REPO)}: {len(pins(text))} distributions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uv", type=Path, required=True, help="the uv binary to resolve with")
    parser.add_argument(
        "--upgrade", action="store_true", help="the newest versions, not those already locked"
    )
    arguments = parser.parse_args()
    write(arguments.uv, upgrade=arguments.upgrade)


if __name__ == "__main__":
    main()
