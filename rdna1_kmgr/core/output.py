"""How commands print for scripts: a flow's typed result, serialised one way for every command's --json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

# Field metadata: a field left out of the JSON object while it is None (a key that only some outcomes have).
OMIT_NONE = "omit_none"


def optional(default: Any = None) -> Any:
    """A field absent from the JSON while it is None (the outcome it belongs to did not happen)."""
    return dataclasses.field(default=default, metadata={OMIT_NONE: True})


def to_json(value: Any) -> Any:
    """A result as JSON values: dataclasses by their fields (or their own to_json), tuples as lists, paths as
    strings; dicts, lists and scalars as they are."""
    if hasattr(value, "to_json"):
        return to_json(value.to_json())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and f.metadata.get(OMIT_NONE):
                continue
            out[f.name] = to_json(item)
        return out
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


# Set in the click context's meta (shared by a command and its group) once a command printed its --json result: a
# command whose result is a failure (a failing verdict) prints its record, then exits non-zero; the error object is
# for a command that had no result to print.
PRINTED_RESULT = "rdna1_kmgr_printed_result"


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(to_json(obj), indent=2, sort_keys=True))
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[PRINTED_RESULT] = True


# The version of the error object below; raised when a key changes meaning or goes (docs/reference.md, "--json").
ERROR_SCHEMA = "rdna1-kmgr.error/1"


def error_json(what: str, hint: str | None, exit_code: int, kind: str) -> dict[str, Any]:
    """A failed command's --json, when it printed no result: what is wrong, what to do, its exit code and the
    code's name."""
    return {"schema": ERROR_SCHEMA, "error": {"what": what, "hint": hint, "exit_code": exit_code, "kind": kind}}
