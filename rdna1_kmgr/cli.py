"""The command line: a thin click layer over the modules that do the work."""

import sys

import click

from rdna1_kmgr import __version__
from rdna1_kmgr.commands.boot_guard import boot_check, confirm, retry
from rdna1_kmgr.commands.build import build
from rdna1_kmgr.commands.detect import detect
from rdna1_kmgr.commands.doctor import doctor
from rdna1_kmgr.commands.experiment import experiment
from rdna1_kmgr.commands.follow import follow
from rdna1_kmgr.commands.hooks import hooks
from rdna1_kmgr.commands.install import install
from rdna1_kmgr.commands.keys import keys
from rdna1_kmgr.commands.profile import profile
from rdna1_kmgr.commands.render import quirks, render
from rdna1_kmgr.commands.rollback import rollback
from rdna1_kmgr.commands.status import status
from rdna1_kmgr.commands.vmtest import vmtest
from rdna1_kmgr.core import command_log
from rdna1_kmgr.core.errors import KmgrError


class KmgrGroup(click.Group):
    """Turns a KmgrError anywhere below into one line on stderr and its exit code."""

    def invoke(self, ctx):
        command_log.start()
        try:
            return super().invoke(ctx)
        except KmgrError as err:
            click.echo(f"rdna1-kmgr: error: {err.line()}", err=True)
            sys.exit(err.exit_code)


@click.group(cls=KmgrGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rdna1-kmgr")
def main():
    """Patch, build, validate and install amdgpu for first-generation RDNA GPUs (RX 5600 XT and siblings)."""


for command in (
    detect,
    doctor,
    experiment,
    render,
    quirks,
    build,
    keys,
    vmtest,
    install,
    confirm,
    retry,
    boot_check,
    rollback,
    status,
    profile,
    follow,
    hooks,
):
    main.add_command(command)
