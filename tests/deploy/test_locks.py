"""The lock files answer pyproject.toml; the image and the virtualenvs install from them alone.

The check reads pyproject.toml and the locks only: no network, no uv. A release on the index
does not make a lock out of date; a dependency added, removed or given another range does.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.dockerfile import read_image
from tests.deploy.tools import REPO

PYPROJECT = REPO / "pyproject.toml"


def _load_locks() -> ModuleType:
    path = REPO / "requirements" / "lock.py"
    spec = importlib.util.spec_from_file_location("requirements_lock", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


locks = _load_locks()


def edited_pyproject(tmp_path: Path, old: str, new: str) -> Path:
    text = PYPROJECT.read_text()
    assert old in text, old
    copy = tmp_path / "pyproject.toml"
    copy.write_text(text.replace(old, new, 1))
    return copy


@pytest.mark.parametrize("lock", locks.LOCKS, ids=lambda lock: lock.name)
def test_the_committed_lock_answers_pyproject(lock: locks.Lock) -> None:
    assert locks.problems(PYPROJECT, lock) == []


def test_the_run_lock_pins_what_the_test_lock_pins() -> None:
    run = locks.pins(locks.RUN.path.read_text())
    test = locks.pins(locks.TEST.path.read_text())
    assert {name: test.get(name) for name in run} == run


def test_every_pin_carries_hashes() -> None:
    for lock in locks.LOCKS:
        text = lock.path.read_text()
        # One entry per distribution: its pin, its hashes, uv's note of what asks for it.
        entries = [e for e in re.split(r"\n(?=\S)", text) if locks.PIN_LINE.match(e)]
        assert len(entries) == len(locks.pins(text)) > 0
        assert all("--hash=sha256:" in entry for entry in entries), lock.name


class TestOutOfDate:
    """Each way pyproject.toml can leave a lock behind is caught, by digest and by versions."""

    def test_a_range_the_locked_version_is_outside(self, tmp_path: Path) -> None:
        pyproject = edited_pyproject(tmp_path, '"uvicorn>=0.29"', '"uvicorn>=0.29,<0.30"')
        found = locks.problems(pyproject, locks.RUN)
        assert any("other dependency specs" in p for p in found)
        assert any("uvicorn==" in p and "outside 'uvicorn>=0.29,<0.30'" in p for p in found)

    def test_a_narrower_range_the_locked_version_is_still_inside(self, tmp_path: Path) -> None:
        pyproject = edited_pyproject(tmp_path, '"uvicorn>=0.29"', '"uvicorn>=0.30"')
        found = locks.problems(pyproject, locks.RUN)
        # Only the digest sees it: `make lock` is still due, the lock was made from other specs.
        assert found == [
            "run.lock was made from other dependency specs than pyproject.toml's",
            "run `make lock`",
        ]

    def test_a_dependency_added(self, tmp_path: Path) -> None:
        pyproject = edited_pyproject(
            tmp_path, '"orjson>=3.9",', '"orjson>=3.9",\n    "no-such-distribution>=1",'
        )
        found = locks.problems(pyproject, locks.RUN)
        assert "'no-such-distribution>=1' is not in run.lock" in found

    def test_a_dependency_removed(self, tmp_path: Path) -> None:
        pyproject = edited_pyproject(tmp_path, '    "orjson>=3.9",\n', "")
        found = locks.problems(pyproject, locks.RUN)
        assert any("has orjson for pyproject.toml, which no longer asks" in p for p in found)

    def test_a_test_dependency_added_leaves_the_run_lock_alone(self, tmp_path: Path) -> None:
        pyproject = edited_pyproject(
            tmp_path, '"pytest>=8",', '"pytest>=8",\n    "no-such-distribution>=1",'
        )
        assert locks.problems(pyproject, locks.RUN) == []
        assert "'no-such-distribution>=1' is not in test.lock" in locks.problems(
            pyproject, locks.TEST
        )

    def test_requires_python_changed(self, tmp_path: Path) -> None:
        pyproject = edited_pyproject(
            tmp_path, 'requires-python = ">=3.11"', 'requires-python = ">=3.12"'
        )
        found = locks.problems(pyproject, locks.TEST)
        assert "test.lock was made from other dependency specs than pyproject.toml's" in found

    def test_a_hand_edited_version(self, tmp_path: Path) -> None:
        lock = tmp_path / "run.lock"
        text = locks.RUN.path.read_text()
        version = locks.pins(text)["uvicorn"]
        lock.write_text(text.replace(f"uvicorn=={version}", "uvicorn==0.28.0"))
        found = locks.problems(PYPROJECT, locks.RUN, lock)
        assert "run.lock has uvicorn==0.28.0, outside 'uvicorn>=0.29'" in found

    def test_a_lock_without_its_digest(self, tmp_path: Path) -> None:
        lock = tmp_path / "run.lock"
        text = locks.RUN.path.read_text()
        lock.write_text(locks.DIGEST_LINE.sub("", text))
        found = locks.problems(PYPROJECT, locks.RUN, lock)
        assert found == [
            "run.lock records no digest of pyproject.toml's dependencies",
            "run `make lock`",
        ]

    def test_comments_and_layout_are_not_a_change(self, tmp_path: Path) -> None:
        pyproject = edited_pyproject(
            tmp_path,
            '"uvicorn>=0.29",',
            '# Kept below the limits\' rewrite.\n    "uvicorn >= 0.29",',
        )
        assert locks.problems(pyproject, locks.RUN) == []


def _dry_run(target: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed")
    done = subprocess.run(
        [make, "--dry-run", "--always-make", "--no-print-directory", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("target", "lock"), [("venv", "run.lock"), ("venv-test", "test.lock")])
def test_make_installs_the_lock_with_hashes_then_the_project_alone(target: str, lock: str) -> None:
    installs = [line for line in _dry_run(target).splitlines() if " pip install " in line]
    assert installs == [
        f".venv/bin/python -m pip install --require-hashes -r requirements/{lock}",
        ".venv/bin/python -m pip install --no-deps -e .",
    ]


def test_the_image_installs_the_run_lock_with_hashes_then_the_project_alone() -> None:
    builder = read_image().stages[0]
    installs = [
        " ".join(i.value.split()) for i in builder if i.name == "RUN" and "pip install" in i.value
    ]
    assert len(installs) == 2
    assert "--require-hashes --requirement requirements/run.lock" in installs[0]
    assert "--no-deps ." in installs[1]
