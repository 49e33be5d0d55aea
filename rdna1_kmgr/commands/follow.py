"""`rdna1-kmgr follow`: the patched amdgpu for a newly installed kernel (what the kernel hooks call)."""

import sys
from collections.abc import Callable

import click

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import KmgrError, UsageError
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.follow import follow_modes, follow_record, kernel_follow

_HOOK = click.option(
    "--hook",
    is_flag=True,
    help="As the package manager's hooks run it: exit status 0 whatever happens, one line per kernel.",
)
_DRY_RUN = click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


@click.group(invoke_without_command=True)
@click.option("--kernel", metavar="KREL", help="The kernel to follow.")
@click.option("--source", metavar="PATH|URL", help="Driver source for KREL instead of the distribution's.")
@_DRY_RUN
@_HOOK
@_JSON
@click.pass_context
def follow(ctx, kernel, source, dry_run, hook, as_json):
    """Build, sign, VM-test and install the patched amdgpu for a new kernel (--kernel KREL), with the quirks
    installed now; the subcommands are what the package manager's hooks do."""
    if ctx.invoked_subcommand is not None:
        if kernel or source or dry_run or hook or as_json:
            raise UsageError(f"options before `follow {ctx.invoked_subcommand}` are not read", "give them after it")
        return
    report(lambda: follow_modes.followed(_release(kernel), source, dry_run), kernel, hook, as_json)


@follow.command("pending")
@_DRY_RUN
@_HOOK
@_JSON
def follow_pending(dry_run, hook, as_json):
    """Follow every kernel the hooks noted as pending (apt's hook and the boot unit run this)."""
    report(lambda: follow_modes.followed(None, None, dry_run), None, hook, as_json)


@follow.command("defer")
@click.argument("kernel", metavar="KREL")
@_DRY_RUN
@_HOOK
@_JSON
def follow_defer(kernel, dry_run, hook, as_json):
    """Only note KREL as pending (what the kernel hooks do inside dpkg)."""
    report(lambda: follow_modes.deferred(user_input.kernel_release(kernel), dry_run), kernel, hook, as_json)


@follow.command("removed")
@click.argument("kernel", metavar="KREL")
@_DRY_RUN
@_HOOK
@_JSON
def follow_removed(kernel, dry_run, hook, as_json):
    """KREL was removed: drop its DKMS package, kbuild tree, journal and records.

    The files every kernel's install shares (the boot guard's, the stock loader's) go back to what was there
    before its install, unless a later install wrote them again: that install then takes the backup."""
    report(lambda: follow_modes.removed(user_input.kernel_release(kernel), dry_run), kernel, hook, as_json)


def report(work: Callable[[], follow_modes.FollowResult], kernel: str | None, hook: bool, as_json: bool) -> None:
    """Run one mode of follow and say its result; under --hook, one line and exit 0 whatever happens."""
    try:
        result = work()
    except KmgrError as err:
        if not hook:
            raise
        # The package manager must go on: the reason is in the record and the log; say it in one line.
        record = follow_record.read(kernel) if kernel and isinstance(err, kernel_follow.StageFailed) else None
        click.echo(f"rdna1-kmgr: {kernel or 'follow'}: {follow_record.describe(record) or err.line()}")
        return
    if as_json:
        emit_json(result)
    elif isinstance(result, follow_modes.FollowPlan):
        click.echo("\n".join(result.plan))
    else:
        for line in result.lines:
            click.echo(line)
    if isinstance(result, follow_modes.Followed) and result.failed and not hook:
        sys.exit(result.failed)


def _release(kernel: str | None) -> str:
    """A plain `follow`'s kernel, checked (inside `report`: under --hook a bad one is a line, not a failure)."""
    if not kernel:
        raise UsageError(
            "give --kernel KREL, or one of the hooks' modes",
            "`follow pending`, `follow defer KREL`, `follow removed KREL`",
        )
    return user_input.kernel_release(kernel)
