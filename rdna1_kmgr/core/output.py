"""How commands print for scripts."""

import json

import click


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))
