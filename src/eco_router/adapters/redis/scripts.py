"""The Lua scripts shipped as package data."""

from __future__ import annotations

from importlib import resources


def load_lua(name: str) -> str:
    """The source of `lua/<name>`."""
    return resources.files("eco_router.adapters.redis").joinpath("lua", name).read_text()
