"""What both benchmarks share: progress lines, percentiles and the JSON result file."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any


def step(title: str, detail: str) -> None:
    print(f"-- {title}: {detail}", flush=True)


def percentile(ranked: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of sorted values; None (not measured) when there are none."""
    if not ranked:
        return None
    value = ranked[max(0, math.ceil(p / 100 * len(ranked)) - 1)]
    return None if math.isinf(value) else round(value, 2)


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def write_json(report: Any, path: Path) -> None:
    """The report dataclass as JSON, stamped with the time it was made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = asdict(report)
    payload["generated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.write_text(json.dumps(payload, indent=2) + "\n")
