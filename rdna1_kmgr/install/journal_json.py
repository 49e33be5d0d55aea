"""A journal record's JSON read strictly: each field as its writer writes it, or NotARecord naming the field.

The record kinds (journal_records.py, install_begin.py) read their fields through these. A record whose fields
no writer of this tool writes is refused when the journal is read, in one line, before anything acts on it;
what a field's value must be for the step that wrote it is journal_checks.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeAlias, TypeVar

# What json.loads gives: the fields a record keeps as another module wrote them (the gate's words on the VM
# verdict, the boot guard's settings, the install's verification, an intent's undo) are this.
# Read only (Mapping, Sequence), so that a writer's dict[str, str] is one too. A writer gives lists, never
# tuples: a record read back must equal what was written.
Json: TypeAlias = "None | bool | int | float | str | Sequence[Json] | Mapping[str, Json]"
JsonObject: TypeAlias = "Mapping[str, Json]"

T = TypeVar("T")


class NotARecord(ValueError):
    """A record no writer of this tool writes; its text follows `record N (kind) ` in the journal's refusal."""


def fields(value: Json, required: Collection[str], optional: Collection[str] = ()) -> JsonObject:
    """`value` as an object with exactly the `required` fields and none but the `optional` ones besides."""
    if not isinstance(value, dict):
        raise NotARecord(f"has {value!r} where rdna1-kmgr writes an object")
    keys = set(value)
    if not set(required) <= keys or not keys <= {*required, *optional}:
        raise NotARecord(f"has the fields {sorted(keys)}, where rdna1-kmgr writes {sorted({*required, *optional})}")
    return value


def text(value: Json, what: str) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise NotARecord(f"has the {what} {value!r}, which is no text")
    return value


def whole(value: Json, what: str) -> int:
    """A JSON whole number (not true or false, which Python reads as 1 and 0)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise NotARecord(f"has the {what} {value!r}, which is no whole number")
    return value


def flag(value: Json, what: str) -> bool:
    if not isinstance(value, bool):
        raise NotARecord(f"has the {what} {value!r}, which is neither true nor false")
    return value


def texts(value: Json, what: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise NotARecord(f"has the {what} {value!r}, which is no list")
    return tuple(text(item, what) for item in value)


def command(value: Json, what: str = "command") -> tuple[str, ...]:
    """A command line: a list of one or more arguments."""
    if not isinstance(value, list) or not value:
        raise NotARecord(f"has the {what} {value!r}, which is no command line")
    return texts(value, what)


def obj(value: Json, what: str) -> JsonObject:
    """An object kept as written (another module's JSON)."""
    if not isinstance(value, dict):
        raise NotARecord(f"has the {what} {value!r}, which is no object")
    return value


def text_map(value: Json, what: str) -> dict[str, str]:
    return {text(key, what): text(item, what) for key, item in obj(value, what).items()}


def or_none(value: Json, read: Callable[[Json, str], T], what: str) -> T | None:
    """`read` the value, which may be null."""
    return None if value is None else read(value, what)
