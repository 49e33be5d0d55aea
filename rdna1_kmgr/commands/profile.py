"""`rdna1-kmgr profile list|install|remove`: ROCm/MIOpen environment settings, system-wide and journaled."""

import click

from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.doctor.kfd_access import invoking_home
from rdna1_kmgr.install import user_profile
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.userspace import profiles


@click.group()
def profile():
    """User-space settings for ROCm and MIOpen (what the experiment matrix varies)."""


@profile.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def list_profiles(as_json):
    """Every profile and what it sets and unsets; experiment controls are marked."""
    catalog = profiles.load()
    if as_json:
        emit_json({name: p.to_json() for name, p in catalog.items()})
        return
    for p in catalog.values():
        changes = " ".join([f"unset {u}" for u in p.unset] + [f"{k}={v}" for k, v in p.set.items()])
        click.echo(
            f"{p.name:20} {p.summary}"
            + (f"\n{'':20} {changes}" if changes else "")
            + (f"\n{'':20} experiment only (not installed): {p.experiment_only}" if p.experiment_only else "")
        )


@profile.command("install")
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Print the exact plan; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def install(name, dry_run, as_json):
    """Write profile NAME to /etc/environment.d and /etc/profile.d (journaled; replaces an installed one).
    Experiment controls (override-1030, small-bar) are refused with the reason."""
    result = user_profile.install(name, dry_run=dry_run, home=invoking_home(TargetRoot.from_env().path))
    if as_json:
        emit_json(result)
        return
    click.echo("\n".join(result.lines()))
    if not dry_run:
        click.echo(
            f"profile {name} installed; log in again (or `source /{user_profile.PROFILE_D}`) to use it; "
            "undo with `rdna1-kmgr profile remove`"
        )


@profile.command("remove")
@click.option("--dry-run", is_flag=True, help="Print the exact plan; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def remove(dry_run, as_json):
    """Undo `profile install` exactly, from its journal."""
    result = user_profile.remove(dry_run=dry_run)
    if as_json:
        emit_json(result)
    else:
        click.echo("\n".join(result.lines()))
