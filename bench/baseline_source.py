"""The router's source at another commit, extracted outside the repository for a baseline run.

`git archive <ref> src` is unpacked into a temporary directory; a router started with
PYTHONPATH=<that directory>/src and this interpreter (or another one, `python`, e.g. a venv of
another Python version with the same dependencies) runs that commit's code with that
environment's dependencies. The checkout's git metadata is left untouched.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.router_process import REPOSITORY_ROOT

GIT_TIMEOUT_S = 60.0


class BaselineUnavailable(Exception):
    """The baseline commit cannot be run here; the message says why."""


@dataclass(frozen=True, slots=True)
class BaselineSource:
    """A commit's `src/` unpacked at `src`, importable as `eco_router` from there, run by
    the interpreter `python`."""

    ref: str
    commit: str
    subject: str
    src: Path
    python: str = sys.executable

    @property
    def title(self) -> str:
        if self.python == sys.executable:
            return f"{self.commit} ({self.subject})"
        return f"{self.commit} ({self.subject}) on {self.python}"

    def pythonpath(self) -> str:
        """PYTHONPATH for a process that must import this commit's `eco_router` first."""
        inherited = os.environ.get("PYTHONPATH")
        return str(self.src) if not inherited else f"{self.src}{os.pathsep}{inherited}"


@contextmanager
def baseline_source(ref: str, python: str | None = None) -> Iterator[BaselineSource]:
    """`ref`'s `src/` in a temporary directory, removed on the way out, to be run by `python`
    (default: this interpreter).

    Raises `BaselineUnavailable` when git is missing, this is not a git checkout, the ref is
    unknown, or the unpacked package does not import with that interpreter.
    """
    commit = _git("rev-parse", "--verify", "--short", f"{ref}^{{commit}}")
    subject = _git("log", "-1", "--format=%s", commit)
    archive = _git_bytes("archive", "--format=tar", commit, "src")
    directory = Path(tempfile.mkdtemp(prefix=f"eco-router-{commit}-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(directory, filter="data")
        source = BaselineSource(ref, commit, subject, directory / "src", python or sys.executable)
        _check_imports(source)
        yield source
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _check_imports(source: BaselineSource) -> None:
    """The unpacked package, not the installed one, is what `python -m` would import."""
    probe = subprocess.run(
        [source.python, "-c", "import eco_router.entrypoints.cli as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": source.pythonpath()},
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    if probe.returncode != 0:
        raise BaselineUnavailable(
            f"{source.commit} does not import here: {probe.stderr.strip().splitlines()[-1:]}"
        )
    if not Path(probe.stdout.strip()).is_relative_to(source.src):
        raise BaselineUnavailable(f"PYTHONPATH did not win: eco_router from {probe.stdout.strip()}")


def _git(*args: str) -> str:
    return _git_bytes(*args).decode().strip()


def _git_bytes(*args: str) -> bytes:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPOSITORY_ROOT), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as error:
        raise BaselineUnavailable("git is not installed") from error
    except subprocess.TimeoutExpired as error:
        raise BaselineUnavailable(f"git {args[0]} took over {GIT_TIMEOUT_S:.0f} s") from error
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()
        raise BaselineUnavailable(f"git {args[0]}: {reason[-1] if reason else done.returncode}")
    return done.stdout
