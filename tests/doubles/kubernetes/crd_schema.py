"""The API server's structural-schema check of a custom resource, played by a tiny OpenAPI v3
validator (types, required, enum, properties, unknown fields), and the schemas it checks:
`SCHEMA` is a fragment of the TFJob CRD's (tests/data/tfjob_crd_v1_schema.json: its $comment
says which Training Operator manifests and what is cut)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA = json.loads((Path(__file__).parents[2] / "data" / "tfjob_crd_v1_schema.json").read_text())

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}


def schema_errors(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Errors of `obj` against a structural schema; unknown fields are errors (the apiserver
    would silently prune them, which is how misplaced fields get lost)."""
    if "anyOf" in schema:
        if all(schema_errors(obj, s, path) for s in schema["anyOf"]):
            return [f"{path}: {obj!r} matches none of {schema['anyOf']}"]
        return []
    kind = schema.get("type")
    if kind:
        ok = isinstance(obj, _TYPES[kind]) and not (kind == "integer" and isinstance(obj, bool))
        if not ok:
            return [f"{path}: expected {kind}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        return [f"{path}: {obj!r} not in {schema['enum']}"]
    errors: list[str] = []
    if isinstance(obj, dict):
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in obj]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        names = schema.get("propertyNames")
        for key, value in obj.items():
            if names and key not in names["enum"]:
                errors.append(f"{path}.{key}: key not in {names['enum']}")
            elif key in props:
                errors += schema_errors(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += schema_errors(value, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
    if isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors
