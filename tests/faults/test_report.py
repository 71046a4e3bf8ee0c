"""The reliability report: which results it accepts and how failover rows render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.faults.report import Refused, load_all, render


def make_result(**overrides: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "scenario": "13-cluster-streams-failover-wait-off",
        "title": "A failover",
        "params": {
            "topology": "Redis Cluster",
            "master_killed": "streams",
            "wait": "off",
            "pending_at_end": 0,
        },
        "sent": 1276,
        "expected": 1200,
        "published": 1198,
        "lost": 2,
        "duplicated_to_clients": 0,
        "dead_lettered": 26,
        "recovery_s": 3.2,
        "recovery_from": "the kill",
        "passed": True,
        "lost_unreplicated": 2,
    }
    return result | overrides


def write(results_dir: Path, *results: dict[str, Any]) -> Path:
    for result in results:
        (results_dir / f"{result['scenario']}.json").write_text(json.dumps(result))
    return results_dir


class TestFailoverRows:
    def test_a_loss_of_unreplicated_entries_is_reported_not_refused(self, tmp_path: Path) -> None:
        results = load_all(write(tmp_path, make_result()))

        text = render(results, when="now")

        assert (
            "| `13-cluster-streams-failover-wait-off` | 1,276 | 1,198 (1,200) | 2 (2 unre" in text
        )
        assert "| Redis Cluster | streams | off | 1,276 | 2 (2) | 0 | 3.2 s | 0 |" in text

    def test_a_loss_beyond_the_unreplicated_entries_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(Refused, match="lost 1"):
            load_all(write(tmp_path, make_result(lost=3)))

    def test_more_unreplicated_than_lost_is_not_a_result(self, tmp_path: Path) -> None:
        with pytest.raises(Refused, match="lost_unreplicated"):
            load_all(write(tmp_path, make_result(lost=1)))

    def test_results_without_a_failover_render_no_failover_table(self, tmp_path: Path) -> None:
        plain = make_result(
            scenario="01-worker-sigkill-20x20", params={}, lost=0, lost_unreplicated=0
        )
        del plain["lost_unreplicated"]

        text = render(load_all(write(tmp_path, plain)), when="now")

        assert "## Failover" not in text
        assert "| `01-worker-sigkill-20x20` | 1,276 | 1,198 (1,200) | 0 |" in text
