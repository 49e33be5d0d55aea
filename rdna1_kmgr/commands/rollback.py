"""`rdna1-kmgr rollback`: undo an install exactly, from its journal."""

import click

from rdna1_kmgr.commands.install import confirm_plan
from rdna1_kmgr.core import output, user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.experiment import boot_cells  # noqa: F401  registers what the experiment's journal may record
from rdna1_kmgr.install.rollback import RollbackResult, run


@click.command()
@click.option(
    "--kernel", metavar="KREL", help="Roll back this kernel only; every other kernel's install stays working."
)
@click.option(
    "--all", "every", is_flag=True, help="Roll back every kernel with an install (the default without --kernel)."
)
@click.option("--dry-run", is_flag=True, help="Print the exact ordered plan; change nothing.")
@click.option(
    "--keep-build",
    is_flag=True,
    help="Keep the built DKMS package (a later install needs no rebuild); by default it is removed.",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
def rollback(kernel, every, dry_run, keep_build, yes) -> output.Shown:
    """Undo what install did, newest step first; safe to run again after an interruption."""
    if kernel is not None and every:
        raise UsageError("--kernel and --all exclude each other", "give one of them")
    kernel = user_input.kernel_release(kernel) if kernel is not None else None
    result = run(kernel, keep_build=keep_build, dry_run=dry_run, confirm=None if yes else confirm_plan("Roll back?"))
    return output.shown(result, _lines(result))


def _lines(result: RollbackResult) -> list[str]:
    """Nothing installed (where no journal was found), the plan (dry run), or the kernels rolled back (each
    journal's lines went to progress as they were replayed)."""
    if result.message is not None:
        return [result.message]
    if result.dry_run:
        return list(result.plan or [])
    return [f"rolled back: {' '.join(result.kernels)}"]
