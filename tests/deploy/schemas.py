"""Schema validation of rendered documents: built-in kinds and the vendored CRD schemas."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonschema
import kubernetes_validate

from tests.deploy.tools import REPO, Document

SCHEMAS = REPO / "deploy" / "schemas"
# The oldest Kubernetes the kit is written for and the newest schema the package bundles.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())


class UnknownKind(Exception):
    """No schema names this apiVersion and kind."""


@functools.cache
def _crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    group, _, version = api_version.rpartition("/")
    path = SCHEMAS / f"{group}_{version}_{kind}.json"
    if not group or not path.is_file():
        return None
    return closed(json.loads(path.read_text()))


def closed(schema: Any) -> Any:
    """The schema with every object that lists its properties refusing others, as the API
    server's strict field validation does (unless it preserves unknown fields)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    if (
        "properties" in result
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


def _crd_document_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's schema plus the metadata every object has (CRDs leave it open)."""
    schema = copy.deepcopy(schema)
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "additionalProperties": False,
    }
    schema.setdefault("required", [])
    schema["required"] = sorted({*schema["required"], "apiVersion", "kind", "metadata"})
    return schema


def validate(doc: Document) -> None:
    """Raise unless `doc` is valid for its kind; `UnknownKind` when no schema knows it."""
    crd = _crd_schema(doc.get("apiVersion", ""), doc.get("kind", ""))
    if crd is not None:
        jsonschema.Draft7Validator(_crd_document_schema(crd)).validate(doc)
        return
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as error:
            raise UnknownKind(f"{doc.get('apiVersion')} {doc.get('kind')}") from error
