"""In-memory adapter of `ReadinessMetrics`: the checks tests can read."""

from __future__ import annotations

from collections.abc import Mapping

from eco_router.application.ports import ReadinessMetrics


class InMemoryReadinessMetrics(ReadinessMetrics):
    """Every set of checks reported, oldest first."""

    def __init__(self) -> None:
        self.reports: list[dict[str, str]] = []

    def readiness_checked(self, checks: Mapping[str, str]) -> None:
        self.reports.append(dict(checks))
