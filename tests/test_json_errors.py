"""Every command's --json answers a failure with the error object docs/reference.md documents ("Errors with
`--json`"): the schema is read from the reference itself, and each command is walked from click's own tree."""

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rdna1_kmgr import cli

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
TYPES = {"object": dict, "string": str, "integer": int, "null": type(None)}


def documented_schema() -> dict:
    section = REFERENCE.read_text().split("### Errors with `--json`", 1)[1]
    return json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))


def problems(value, schema: dict, where: str = "$") -> list[str]:
    """The ways `value` breaks `schema` (the JSON Schema keywords the reference's schema uses)."""
    if "const" in schema:
        return [] if value == schema["const"] else [f"{where}: {value!r} is not {schema['const']!r}"]
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    if kinds and not any(isinstance(value, TYPES[k]) and not isinstance(value, bool) for k in kinds):
        return [f"{where}: {value!r} is not of type {kinds}"]
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


def commands_with_json(group: click.Group = cli.main, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            found += commands_with_json(command, (*path, name))
        elif any("--json" in p.opts for p in command.params if isinstance(p, click.Option)):
            found.append((*path, name))
    return found


def test_the_schema_check_sees_what_it_forbids():
    schema = documented_schema()
    good = {"schema": "rdna1-kmgr.error/1", "error": {"what": "w", "hint": None, "exit_code": 2, "kind": "usage"}}
    assert problems(good, schema) == []
    assert problems({**good, "extra": 1}, schema)
    assert problems({**good, "error": {**good["error"], "exit_code": True}}, schema)
    assert problems({**good, "schema": "rdna1-kmgr.error/2"}, schema)


def test_every_command_with_json_answers_a_bad_option_with_the_documented_error():
    commands = commands_with_json()
    assert len(commands) >= 15 and ("rollback",) in commands and ("keys", "status") in commands, commands
    schema = documented_schema()
    for command in commands:
        result = CliRunner().invoke(cli.main, [*command, "--json", "--no-such-option"])
        assert result.exit_code == 2, (command, result.output)
        answer = json.loads(result.stdout)
        assert problems(answer, schema) == [], (command, answer)
        assert "--no-such-option" in answer["error"]["what"]


@pytest.mark.parametrize(
    "args, kind, code",
    [
        (["rollback", "--kernel", "not a release", "--dry-run", "--json"], "usage", 2),
        (["install", "--kernel", "../6.1.0-56-amd64", "--dry-run", "--json"], "usage", 2),
    ],
)
def test_the_tools_own_errors_come_as_the_documented_object_with_their_exit_code(args, kind, code):
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == code, result.output
    answer = json.loads(result.stdout)
    assert problems(answer, documented_schema()) == []
    assert answer["error"]["kind"] == kind and answer["error"]["exit_code"] == code
    assert result.stderr.startswith("rdna1-kmgr: error: " + answer["error"]["what"])
