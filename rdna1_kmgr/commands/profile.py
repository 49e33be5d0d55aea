"""`rdna1-kmgr profile list|install|remove`: ROCm/MIOpen environment settings, system-wide and journaled."""

import click

from rdna1_kmgr.core import output
from rdna1_kmgr.doctor.kfd_access import invoking_home
from rdna1_kmgr.install import user_profile
from rdna1_kmgr.install.profile_result import ProfileCatalog
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.userspace import profiles


@click.group()
def profile():
    """User-space settings for ROCm and MIOpen (what the experiment matrix varies)."""


@profile.command("list")
@output.json_option
def list_profiles() -> output.Shown:
    """Every profile and what it sets and unsets; experiment controls are marked."""
    catalog = ProfileCatalog(tuple(profiles.load().values()))
    return output.shown(catalog, catalog.lines())


@profile.command("install")
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Print the exact plan; change nothing.")
@output.json_option
def install(name, dry_run) -> output.Shown:
    """Write profile NAME to /etc/environment.d and /etc/profile.d (journaled; replaces an installed one).
    Experiment controls (override-1030, small-bar) are refused with the reason."""
    result = user_profile.install(name, dry_run=dry_run, home=invoking_home(TargetRoot.from_env().path))
    lines = list(result.lines())
    if not dry_run:
        lines.append(
            f"profile {name} installed; log in again (or `source /{user_profile.PROFILE_D}`) to use it; "
            "undo with `rdna1-kmgr profile remove`"
        )
    return output.shown(result, lines)


@profile.command("remove")
@click.option("--dry-run", is_flag=True, help="Print the exact plan; change nothing.")
@output.json_option
def remove(dry_run) -> output.Shown:
    """Undo `profile install` exactly, from its journal."""
    result = user_profile.remove(dry_run=dry_run)
    return output.shown(result, result.lines())
