"""The environment variables the program reads: the settings model's, plus uvicorn's one."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import AliasChoices

from eco_router.entrypoints.settings import Settings

ENV_PREFIX = str(Settings.model_config.get("env_prefix", ""))

# Read by uvicorn.Config, which `serve` builds: the proxies whose X-Forwarded-For is trusted.
OTHER_VARIABLES = frozenset({"FORWARDED_ALLOW_IPS"})


def settings_variables() -> frozenset[str]:
    """Every name the pydantic settings read: aliases where a field has them, else prefix+name."""
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice) for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(f"{ENV_PREFIX}{name}".upper())
    return frozenset(names)


def known_variables() -> frozenset[str]:
    return settings_variables() | OTHER_VARIABLES


def unknown(names: Iterable[str]) -> list[str]:
    known = known_variables()
    return sorted(n for n in names if n not in known)
