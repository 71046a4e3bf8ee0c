"""The image, built once per session with podman on the stand-in base, as `make image` builds it.

Nothing here skips: without a working podman (installed by `make podman` when missing) the
container tests fail, since they are the only check that the image builds and runs.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.container.podman import environment
from tests.deploy.tools import REPO

IMAGE = "localhost/eco-router:container-tests"
# Seconds each step took this session, printed after the tests.
TIMINGS: dict[str, float] = {}


def _make(target: str, *variables: str, timeout: float) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed")
    started = time.monotonic()
    done = subprocess.run(
        [make, "--no-print-directory", target, *variables],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    TIMINGS[f"make {target}"] = time.monotonic() - started
    if done.returncode != 0:
        pytest.fail(f"make {target} {' '.join(variables)} failed:\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def stand_in_images() -> None:
    """podman installed if missing, and the stand-in base and Redis images (kept once made)."""
    _make("podman", timeout=600)
    _make("stand-in-base", timeout=600)


@pytest.fixture(scope="session")
def image(stand_in_images: None) -> str:
    """The project's image, built by `make image` on the stand-in base (layers cached)."""
    del stand_in_images
    _make("image", "STAND_IN=1", f"IMAGE={IMAGE}", timeout=900)
    return IMAGE


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in TIMINGS.items())
        terminalreporter.write_line(f"container images: {steps}")
