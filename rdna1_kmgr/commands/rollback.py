"""`rdna1-kmgr rollback`: undo an install exactly, from its journal."""

import click

from rdna1_kmgr.commands.install import confirm_plan
from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.experiment import boot_cells  # noqa: F401  registers what the experiment's journal may record
from rdna1_kmgr.install.rollback import run


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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def rollback(kernel, every, dry_run, keep_build, yes, as_json):
    """Undo what install did, newest step first; safe to run again after an interruption."""
    if kernel is not None and every:
        raise UsageError("--kernel and --all exclude each other", "give one of them")
    kernel = user_input.kernel_release(kernel) if kernel is not None else None
    result = run(kernel, keep_build=keep_build, dry_run=dry_run, confirm=None if yes else confirm_plan("Roll back?"))
    if as_json:
        emit_json(result)
    elif result.message is not None:
        click.echo(result.message)
    elif result.dry_run:
        click.echo("\n".join(result.plan or []))
    else:
        click.echo(f"rolled back: {' '.join(result.kernels)}")
