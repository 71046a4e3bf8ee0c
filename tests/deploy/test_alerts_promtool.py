"""The PrometheusRule, checked and unit-tested by Prometheus' own `promtool`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.monitoring_support import (
    PROMTOOL_TESTS,
    RULE_FILE,
    operations_anchors,
    prometheus_tool,
    rules,
    write_rules_file,
)


@pytest.fixture(scope="module")
def promtool() -> str:
    return prometheus_tool("promtool")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def unit_tests_in(directory: Path) -> Path:
    """The alert unit tests beside the rules file they read."""
    target = directory / "alerts_test.yaml"
    shutil.copy(PROMTOOL_TESTS / "alerts_test.yaml", target)
    return target


class TestRulesFile:
    def test_promtool_accepts_every_rule(self, promtool: str, tmp_path: Path) -> None:
        done = run(promtool, "check", "rules", str(write_rules_file(tmp_path)))

        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{len(rules())} rules found" in done.stdout

    def test_every_alert_has_a_severity_a_summary_a_description_and_a_runbook_section(
        self,
    ) -> None:
        anchors = operations_anchors()
        for rule in rules():
            assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
            annotations = rule["annotations"]
            assert annotations["summary"], rule["alert"]
            assert annotations["description"], rule["alert"]
            page, _, anchor = annotations["runbook_url"].partition("#")
            assert page == "docs/OPERATIONS.md"
            assert anchor in anchors, f"{rule['alert']}: no section #{anchor}"

    def test_the_kustomization_ships_the_rule_file(self) -> None:
        kustomization = yaml.safe_load((RULE_FILE.parent / "kustomization.yaml").read_text())

        assert RULE_FILE.name in kustomization["resources"]


class TestAlertUnitTests:
    def test_every_alert_fires_and_stays_quiet_where_its_unit_tests_say(
        self, promtool: str, tmp_path: Path
    ) -> None:
        write_rules_file(tmp_path)

        done = run(promtool, "test", "rules", str(unit_tests_in(tmp_path)))

        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout

    def test_every_alert_has_a_firing_case_and_a_quiet_case(self) -> None:
        tests = yaml.safe_load((PROMTOOL_TESTS / "alerts_test.yaml").read_text())["tests"]
        firing: set[str] = set()
        quiet: set[str] = set()
        for test in tests:
            for check in test["alert_rule_test"]:
                (firing if check["exp_alerts"] else quiet).add(check["alertname"])
        alerts = {rule["alert"] for rule in rules()}

        assert firing == alerts
        # Quiet cases for the rest are series inside a firing case that must not fire.
        assert len(quiet) >= len(alerts) - 3

    def test_a_changed_threshold_fails_the_unit_tests(self, promtool: str, tmp_path: Path) -> None:
        rules_file = write_rules_file(tmp_path)
        loosened = rules_file.read_text().replace("for: 30m", "for: 40m")
        assert loosened != rules_file.read_text()
        rules_file.write_text(loosened)

        done = run(promtool, "test", "rules", str(unit_tests_in(tmp_path)))

        assert done.returncode != 0
        assert "EcoRouterPendingStuck" in done.stdout + done.stderr
