"""`rdna1-kmgr confirm`, `retry` and `boot-check`: the boot guard's commands (install sets the guard up)."""

import click

from rdna1_kmgr.core import output
from rdna1_kmgr.install import boot_guard
from rdna1_kmgr.install.target_root import TargetRoot


@click.command()
@click.option("--auto", is_flag=True, help="Confirm only if this boot is good (what the confirm timer runs).")
@click.option(
    "--target",
    type=click.Choice(boot_guard.TARGETS),
    default=None,
    help="With --auto: the systemd target that must be reached (default: multi-user.target).",
)
@click.option("--dry-run", is_flag=True, help="Print the command that would record it; change nothing.")
def confirm(auto, target, dry_run) -> output.Shown:
    """Confirm this trial boot: later boots keep the RDNA1 quirks on."""
    return output.shown(None, boot_guard.confirm(TargetRoot.from_env(), auto=auto, target=target, dry_run=dry_run))


@click.command()
@click.option("--dry-run", is_flag=True, help="Print the command that would arm it; change nothing.")
def retry(dry_run) -> output.Shown:
    """Make the next boot one more trial with the RDNA1 quirks on."""
    return output.shown(None, boot_guard.retry(TargetRoot.from_env(), dry_run=dry_run))


@click.command("boot-check", hidden=True)
def boot_check() -> output.Shown:
    """Run at every boot by rdna1-kmgr-boot-check.service: say what kind of boot this is."""
    return output.shown(None, boot_guard.boot_check(TargetRoot.from_env()))
