"""`rdna1-kmgr hooks install|remove`: the package manager's hooks that call `rdna1-kmgr follow`."""

from pathlib import Path

import click

from rdna1_kmgr.core import output
from rdna1_kmgr.follow import hooks as kernel_hooks
from rdna1_kmgr.install.target_root import TargetRoot


@click.group()
def hooks():
    """Place or remove the kernel hooks (postinst.d, header_postinst.d, postrm.d, apt, systemd)."""


@hooks.command("install")
@click.option("--cli", metavar="PATH", help="The command the hooks call (default: this installation's).")
@click.option("--dry-run", is_flag=True, help="Print what would be written; change nothing.")
def install_hooks(cli, dry_run) -> output.Shown:
    """Place the hooks (install.sh does this). Idempotent."""
    command = Path(cli).absolute() if cli else kernel_hooks.this_command()
    lines = kernel_hooks.install(TargetRoot.from_env(), command, dry_run)
    # Said first: the hooks are root's, and a copy run from elsewhere re-points them at itself.
    return output.shown(None, [f"the hooks call {command}", *(lines or ["the hooks are in place already"])])


@hooks.command("remove")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; change nothing.")
def remove_hooks(dry_run) -> output.Shown:
    """Remove the hooks: new kernels stay stock, nothing follows them."""
    lines = kernel_hooks.remove(TargetRoot.from_env(), dry_run)
    return output.shown(None, lines or ["no hook of rdna1-kmgr is in place"])
