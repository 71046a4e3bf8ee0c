"""The process environment a test starts from: no setting from the shell that runs it."""

from __future__ import annotations

import os

import pytest


def clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every `EVENT_ROUTER_*` and `REDIS_*` variable and `POD_NAME` for the test, so
    its settings are the documented defaults and what it sets itself."""
    for name in list(os.environ):
        if name.startswith(("EVENT_ROUTER_", "REDIS_")) or name == "POD_NAME":
            monkeypatch.delenv(name)
