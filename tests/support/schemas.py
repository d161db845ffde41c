"""Validate JSON documents against docs/schemas/*.schema.json (JSON Schema 2020-12).

Every schema has an ``urn:pgflow-cli:schema:<name>`` id; ``common`` holds the shared definitions
(``database``, ``timestamp``, ``error``) the others reference, resolved from the same directory.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


@cache
def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


def schema(name: str) -> dict[str, Any]:
    """The schema ``docs/schemas/<name>.schema.json``."""
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def validate(document: Any, name: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``document`` matches schema ``name`` (formats checked)."""
    validator = jsonschema.Draft202012Validator(schema(name), registry=_registry(),
                                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        raise jsonschema.ValidationError("; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]))


def validate_kind(document: dict[str, Any]) -> str:
    """Validate a document against the schema its ``kind`` names; returns that name."""
    name = document["kind"].removeprefix("pgflow-cli/")
    validate(document, name)
    return name
