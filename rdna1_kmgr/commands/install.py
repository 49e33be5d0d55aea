"""`rdna1-kmgr install`: install the built, VM-validated module for a kernel, journaled."""

import sys

import click

from rdna1_kmgr.core import output, progress, root_only
from rdna1_kmgr.install import boot_guard
from rdna1_kmgr.install.install_result import InstallResult
from rdna1_kmgr.install.module_install import InstallRequest, run
from rdna1_kmgr.render.quirk_mask import QuirkMask
from rdna1_kmgr.source.target_kernel import kernel_to_install


def confirm_plan(question: str):
    """Ask on a terminal; without one, nobody can say yes (pass --yes)."""

    def confirm(lines: list[str]) -> bool:
        if not sys.stdin.isatty():
            return False
        for line in lines:
            progress.say(line)
        return click.confirm(question, default=False, err=True)

    return confirm


@click.command()
@click.option(
    "--kernel",
    metavar="KREL",
    help="Kernel release to install for (default: the running kernel, "
    "or the distribution's current one when the running kernel is not the distribution's).",
)
@click.option("--dry-run", is_flag=True, help="Print the exact ordered plan (commands, files); change nothing.")
@click.option(
    "--skip-vm-check",
    is_flag=True,
    help="Install without a passing VM verdict (warned about, and recorded in the journal).",
)
@click.option("--cert", metavar="FILE", help="Certificate the module was signed with (default: the distro's DKMS one).")
@click.option(
    "--quirks",
    "quirks",
    metavar="MASK",
    help="rdna1_quirks to set (e.g. 0x1, the experiment's pick; default: all the build's).",
)
@click.option(
    "--confirm-after",
    type=click.IntRange(min=0),
    default=boot_guard.CONFIRM_AFTER,
    show_default=True,
    metavar="SECONDS",
    help="Boot guard: how long the trial boot must be up before it confirms itself.",
)
@click.option(
    "--confirm-target",
    type=click.Choice(boot_guard.TARGETS),
    default=None,
    help="Boot guard: the systemd target the trial boot must reach (default: the machine's default).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
def install(kernel, dry_run, skip_vm_check, cert, quirks, confirm_after, confirm_target, yes) -> output.Shown:
    """Install the built module for a kernel: dkms install, depmod, modprobe.d, initramfs, verified."""
    if not dry_run:
        root_only.required("install")
    mask = QuirkMask.parse(quirks) if quirks is not None else None  # bad input first, before any lookup
    request = InstallRequest(
        kernel=kernel_to_install(kernel, dry_run),
        skip_vm_check=skip_vm_check,
        cert=cert,
        dry_run=dry_run,
        quirks=mask,
        confirm_after=confirm_after,
        confirm_target=confirm_target,
    )
    result = run(request, confirm=None if yes else confirm_plan("Install it?"))
    return output.shown(result, _lines(result))


def _lines(result: InstallResult) -> list[str]:
    """Already in place (verified), the plan (dry run), or what the next boot of the kernel does."""
    if result.already_installed:
        assert result.verified is not None
        return [
            f"{result.package}/{result.package_version} is already installed for {result.kernel} "
            f"and verified: {result.verified.module}"
        ]
    return list(result.plan if result.dry_run else result.next_boot)
