"""The command line: a thin click layer over the modules that do the work."""

import sys

import click

from . import __version__
from .errors import KmgrError


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
from .commands.install import install  # noqa: E402
main.add_command(install)
from .commands.rollback import rollback  # noqa: E402
main.add_command(rollback)
from .commands.status import status  # noqa: E402
main.add_command(status)
