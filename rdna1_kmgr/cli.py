"""The command line: a thin click layer over the modules that do the work."""

import sys

import click

from . import __version__
from .errors import KmgrError, NotBuiltYet


class KmgrGroup(click.Group):
    """Turns a KmgrError anywhere below into one line on stderr and its exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KmgrError as err:
            click.echo(f"rdna1-kmgr: error: {err.line()}", err=True)
            sys.exit(err.exit_code)


@click.group(cls=KmgrGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rdna1-kmgr")
def main():
    """Patch, build, validate and install amdgpu for first-generation RDNA GPUs (RX 5600 XT and siblings)."""


def _not_built(name: str, issue: str):
    raise NotBuiltYet(f"`{name}` is not built yet", f"see the project's issue: {issue}")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def install():
    """Install the built, VM-validated module (not built yet)."""
    _not_built("install", "journaled install gated by the VM verdict")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def rollback():
    """Undo an install exactly, from the journal (not built yet)."""
    _not_built("rollback", "journaled install and crash-safe rollback")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def status():
    """Show what is installed per kernel (not built yet)."""
    _not_built("status", "journaled install and crash-safe rollback")


# Commands that are built live in rdna1_kmgr/commands/, one module each.
from .commands.detect import detect  # noqa: E402
main.add_command(detect)
from .commands.render import quirks, render  # noqa: E402
main.add_command(render)
main.add_command(quirks)
from .commands.build import build  # noqa: E402
main.add_command(build)
from .commands.keys import keys  # noqa: E402
main.add_command(keys)
from .commands.vmtest import vmtest  # noqa: E402
main.add_command(vmtest)
