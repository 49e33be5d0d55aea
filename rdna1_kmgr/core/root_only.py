"""A command that changes the system, asked for by a user: refused in one line before anything is said or read,
with the command line to type (`sudo rdna1-kmgr` and the arguments as typed, flags included)."""

from __future__ import annotations

import os
import shlex

import click

from rdna1_kmgr.core.errors import HostError

ARGV_KEY = "rdna1_kmgr.argv"  # where cli.py keeps the command line as typed


def typed(fallback: str) -> str:
    """The arguments as the user typed them (the top-level context keeps them), else `fallback`."""
    ctx = click.get_current_context(silent=True)
    argv = ctx.find_root().meta.get(ARGV_KEY) if ctx is not None else None
    return shlex.join(argv) if argv else fallback


def required(doing: str) -> None:
    if os.geteuid() != 0:
        raise HostError(f"{doing} changes the system and needs root", f"run `sudo rdna1-kmgr {typed(doing)}`")
