"""core/output.py: a typed result as the JSON a script reads."""

import json
from dataclasses import dataclass
from pathlib import Path

import click
from click.testing import CliRunner

from rdna1_kmgr.core.output import emit_json, optional, to_json


@dataclass(frozen=True)
class Inner:
    name: str
    where: Path


@dataclass(frozen=True)
class Outcome:
    done: bool
    items: tuple[Inner, ...]
    note: str | None  # a plain None stays, as null
    plan: list[str] | None = optional()  # left out while None


class OwnShape:
    def to_json(self):
        return {"flat": Inner("a", Path("/x"))}


def test_fields_by_name_nested_tuples_as_lists_paths_as_strings():
    value = Outcome(True, (Inner("a", Path("/x/y")),), None)
    assert to_json(value) == {"done": True, "items": [{"name": "a", "where": "/x/y"}], "note": None}


def test_an_optional_field_appears_once_it_has_a_value():
    assert to_json(Outcome(False, (), "n", plan=["step"]))["plan"] == ["step"]


def test_a_types_own_to_json_wins_and_is_serialised_in_turn():
    assert to_json({"k": OwnShape()}) == {"k": {"flat": {"name": "a", "where": "/x"}}}


def test_emit_json_prints_one_sorted_indented_object():
    @click.command()
    def show():
        emit_json(Outcome(True, (), None))

    out = CliRunner().invoke(show).stdout
    assert json.loads(out) == {"done": True, "items": [], "note": None}
    assert out == '{\n  "done": true,\n  "items": [],\n  "note": null\n}\n'
