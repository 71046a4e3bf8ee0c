"""yamllint, with the repository's .yamllint, over deploy/ and compose.yaml."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.tools import REPO, run_tool

CONFIG = REPO / ".yamllint"


def test_the_kit_passes_yamllint() -> None:
    done = run_tool("yamllint", "--strict", "-c", CONFIG, "deploy", "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def _line(length: int) -> str:
    words = "key: " + " ".join(["word"] * length)
    return words[:length].rstrip() + "x\n"


def test_yamllint_applies_the_repositorys_rules(tmp_path: Path) -> None:
    # 90 columns: past yamllint's default of 80, within the repository's 100.
    fits = tmp_path / "fits.yaml"
    fits.write_text(_line(90))
    assert run_tool("yamllint", "--strict", "-c", CONFIG, fits).returncode == 0
    assert run_tool("yamllint", "--strict", "-d", "default", fits).returncode != 0
    too_long = tmp_path / "too_long.yaml"
    too_long.write_text(_line(110) + "list:\n  - a  \n")
    done = run_tool("yamllint", "--strict", "-c", CONFIG, too_long)
    assert done.returncode != 0
    assert "(line-length)" in done.stdout
    assert "(trailing-spaces)" in done.stdout
