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


# The click context's meta keys (shared by a command and its groups): whether the command was given --json, the
# command's words ("keys status"), and whether its --json result is out (a failing verdict prints its record, then
# fails: the error object is for a command that had no result to print).
WANTS_JSON = "rdna1_kmgr_wants_json"
COMMAND_WORDS = "rdna1_kmgr_command"
PRINTED_RESULT = "rdna1_kmgr_printed_result"

# Every --json document is one object whose "output_schema" names what it is and the version of its keys:
# "rdna1-kmgr.<command>/<version>" for a command's result (its fields beside), "rdna1-kmgr.error/<version>" for an
# error (in "error"). A version goes up when a key changes meaning or goes; new keys keep it (docs/reference.md).
# Not "schema": the records a command prints as its result (a verdict, a render's manifest) carry their own file
# format's "schema", which stays theirs.
SCHEMA_KEY = "output_schema"
SCHEMA_PREFIX = "rdna1-kmgr."
RESULT_VERSION = 1
ERROR_SCHEMA = f"{SCHEMA_PREFIX}error/1"


def result_schema(command: str) -> str:
    """ "keys status" -> "rdna1-kmgr.keys.status/1"."""
    return f"{SCHEMA_PREFIX}{command.replace(' ', '.')}/{RESULT_VERSION}"


@dataclasses.dataclass(frozen=True)
class Shown:
    """What a command returns for the group to show (cli.py): its typed result (--json: output.to_json of it, with
    the schema beside its fields), the lines its text form prints, and how the command ends after showing it: a
    failure (its one line, its exit code: a failing verdict) or an exit code of its own (follow's failed count)."""

    value: Any
    text: tuple[str, ...]
    failure: Exception | None = None  # a KmgrError (core.errors imports nothing of this module's)
    exit_code: int = 0


def shown(value: Any, text: list[str] | tuple[str, ...] | str, **how_it_ends: Any) -> Shown:
    """A Shown from a list of lines or one block of text."""
    lines = tuple(text.split("\n")) if isinstance(text, str) else tuple(text)
    return Shown(value, lines, **how_it_ends)


def _record_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    ctx.meta[WANTS_JSON] = value
    ctx.meta[COMMAND_WORDS] = " ".join(ctx.command_path.split()[1:])
    return value


def json_option(func: Any) -> Any:
    """`--json`, read by the group when it shows the command's result (the command itself never asks)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_record_json,
        help="Print one JSON object (its schema: docs/reference.md).",
    )(func)


def command_words(ctx: click.Context) -> str:
    """The command as the schema names it: "keys status" for `rdna1-kmgr keys status`."""
    return ctx.meta.get(COMMAND_WORDS, "")


def show(ctx: click.Context, result: Shown) -> None:
    """The one place a command's result is printed: its JSON document, or its text lines."""
    if ctx.meta.get(WANTS_JSON):
        document = to_json(result.value)
        if not isinstance(document, dict):
            raise TypeError(f"a --json result is an object, not {type(document).__name__}")
        if SCHEMA_KEY in document:
            raise TypeError(f"a --json result has a field named {SCHEMA_KEY}, the envelope's")
        emit_json({SCHEMA_KEY: result_schema(command_words(ctx)), **document})
    elif result.text:
        click.echo("\n".join(result.text))


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(to_json(obj), indent=2, sort_keys=True))
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[PRINTED_RESULT] = True


def error_json(what: str, hint: str | None, exit_code: int, kind: str, command: str = "") -> dict[str, Any]:
    """A failed command's --json, when it printed no result: what is wrong, what to do, its exit code and the
    code's name."""
    return {
        SCHEMA_KEY: ERROR_SCHEMA,
        "command": command,
        "error": {"what": what, "hint": hint, "exit_code": exit_code, "kind": kind},
    }
