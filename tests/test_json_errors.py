"""Every command's --json answers a failure with the error object docs/reference.md documents ("Output with
`--json`"): the schema is read from the reference itself, and each command is walked from click's own tree."""

import json

import click
import pytest
from click.testing import CliRunner
from json_fixtures import documented_schemas, problems

from rdna1_kmgr import cli


def documented_schema() -> dict:
    return documented_schemas()[1]


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
    error = {"what": "w", "hint": None, "exit_code": 2, "kind": "usage"}
    good = {"output_schema": "rdna1-kmgr.error/1", "command": "keys status", "error": error}
    assert problems(good, schema) == []
    assert problems({**good, "extra": 1}, schema)
    assert problems({**good, "error": {**good["error"], "exit_code": True}}, schema)
    assert problems({**good, "output_schema": "rdna1-kmgr.error/2"}, schema)
    result = documented_schemas()[0]
    assert problems({"output_schema": "rdna1-kmgr.keys.status/1", "pair": {}}, result) == []
    assert problems({"output_schema": "rdna1-kmgr.keys status/1"}, result)
    assert problems({"schema": 1}, result)


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
        assert answer["command"] == " ".join(command)


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
    assert answer["command"] == args[0]
    assert result.stderr.startswith("rdna1-kmgr: error: " + answer["error"]["what"])
