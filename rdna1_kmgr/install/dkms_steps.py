"""The DKMS commands install's dkms-install step records: run by it, undone by rollback, checked by
journal_checks against what a journal says."""

from __future__ import annotations

from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.install.undo import DkmsUninstall, dkms_uninstall
from rdna1_kmgr.modbuild import dkms_package as dkms


def install_command(package: dkms.Package, kernel: str, trees: dkms.Trees, root: TargetRoot) -> list[str]:
    return [*dkms.command(dkms.install_args(package, kernel), trees), *root.dkms_options()]


def uninstall_undo(package: dkms.Package, kernel: str, trees: dkms.Trees, root: TargetRoot) -> DkmsUninstall:
    """The dkms-install step's undo (rollback runs its command)."""
    command = [*dkms.command(dkms.uninstall_args(package, kernel), trees), *root.dkms_options()]
    return dkms_uninstall(package, kernel, command, trees)
