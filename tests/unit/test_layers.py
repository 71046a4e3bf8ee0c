"""The dependency rule, checked on the source itself (import-linter checks it too, in lint)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "src" / "eco_router"

FORBIDDEN = {
    "domain": (
        "redis", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings",
        "dependency_injector", "prometheus_client", "orjson", "asyncio",
        "eco_router.application", "eco_router.adapters", "eco_router.entrypoints",
    ),
    "application": (
        "redis", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings",
        "dependency_injector", "prometheus_client", "orjson",
        "eco_router.adapters", "eco_router.entrypoints",
    ),
    "adapters": ("eco_router.entrypoints", "fastapi", "dependency_injector", "pydantic_settings"),
}  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def violations(layer: str) -> list[str]:
    found = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in imported_modules(path):
            for banned in FORBIDDEN[layer]:
                if module == banned or module.startswith(banned + "."):
                    found.append(f"{path.relative_to(PACKAGE)} imports {module}")
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_from_outer_layers(layer: str) -> None:
    assert (PACKAGE / layer).is_dir()
    assert violations(layer) == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "leaky.py"
    module.write_text("import redis.asyncio\nfrom eco_router.adapters.redis import keys\n")
    assert imported_modules(module) == {"redis.asyncio", "eco_router.adapters.redis"}
