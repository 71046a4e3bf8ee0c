"""What the Dockerfile's final stage declares, read with dockerfile-parse."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dockerfile_parse import DockerfileParser

from tests.deploy.tools import REPO

DOCKERFILE = REPO / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    name: str
    value: str


@dataclass(frozen=True)
class Image:
    """The final stage of a Dockerfile and the stages before it."""

    base: str
    stages: tuple[tuple[Instruction, ...], ...]

    @property
    def final(self) -> tuple[Instruction, ...]:
        return self.stages[-1]

    def values(self, name: str) -> list[str]:
        return [i.value for i in self.final if i.name == name]

    def exec_form(self, name: str) -> list[str]:
        """ENTRYPOINT or CMD of the final stage; only the JSON (exec) form is accepted."""
        values = self.values(name)
        if len(values) != 1:
            raise AssertionError(f"{name} appears {len(values)} times in the final stage")
        parsed = json.loads(values[0])
        if not isinstance(parsed, list) or not all(isinstance(p, str) for p in parsed):
            raise AssertionError(f"{name} is not in exec form: {values[0]}")
        return parsed

    @property
    def user(self) -> tuple[int, int | None]:
        """The final USER as numbers (a name fails: runAsNonRoot cannot check one)."""
        values = self.values("USER")
        if not values:
            raise AssertionError("the final stage sets no USER")
        user, _, group = values[-1].partition(":")
        return int(user), int(group) if group else None

    @property
    def exposed(self) -> set[int]:
        return {int(p.split("/")[0]) for v in self.values("EXPOSE") for p in v.split()}


def read_image(path: Path = DOCKERFILE) -> Image:
    parser = DockerfileParser(path=str(path))
    stages: list[list[Instruction]] = []
    for item in parser.structure:
        name = item["instruction"].upper()
        if name == "COMMENT":
            continue
        if name == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(Instruction(name, item["value"]))
    return Image(base=str(parser.baseimage), stages=tuple(tuple(s) for s in stages))
