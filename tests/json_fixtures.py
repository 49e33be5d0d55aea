"""The JSON Schemas docs/reference.md documents for `--json` ("Output with `--json`": a result's envelope, then the
error object), read from the reference itself, and a checker for the keywords they use."""

from __future__ import annotations

import json
import re
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
TYPES = {"object": dict, "string": str, "integer": int, "null": type(None)}


def documented_schemas() -> tuple[dict, dict]:
    """(a result's schema, the error's schema), in the order the section gives them."""
    section = REFERENCE.read_text().split("### Output with `--json`", 1)[1].split("\n## ", 1)[0]
    result, error = (json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S))
    return result, error


def problems(value, schema: dict, where: str = "$") -> list[str]:
    """The ways `value` breaks `schema` (the JSON Schema keywords the reference's schemas use)."""
    if "const" in schema:
        return [] if value == schema["const"] else [f"{where}: {value!r} is not {schema['const']!r}"]
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    if kinds and not any(isinstance(value, TYPES[k]) and not isinstance(value, bool) for k in kinds):
        return [f"{where}: {value!r} is not of type {kinds}"]
    if "pattern" in schema and not re.search(schema["pattern"], value):
        return [f"{where}: {value!r} does not match {schema['pattern']!r}"]
    found = []
    if isinstance(value, dict):
        found += [f"{where}: no {key!r}" for key in schema.get("required", []) if key not in value]
        extra = set(value) - set(schema.get("properties", {}))
        if schema.get("additionalProperties") is False and extra:
            found.append(f"{where}: keys the schema lacks: {sorted(extra)}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                found += problems(value[key], sub, f"{where}.{key}")
    return found
