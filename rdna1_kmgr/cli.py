"""The command line: a thin click layer over the modules that do the work."""

import sys

import click

from rdna1_kmgr import __version__
from .commands.boot_guard import boot_check, confirm, retry
from .commands.build import build
from .commands.detect import detect
from .commands.install import install
from .commands.keys import keys
from .commands.render import quirks, render
from .commands.rollback import rollback
from .commands.status import status
from .commands.vmtest import vmtest
from rdna1_kmgr.core.errors import KmgrError


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


for command in (detect, render, quirks, build, keys, vmtest, install, confirm, retry, boot_check, rollback, status):
    main.add_command(command)
