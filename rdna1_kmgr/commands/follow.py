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
@click.option("--kernel", metavar="KREL", help="The kernel to follow (or, with --removed, to forget).")
@click.option("--pending", "run_pending", is_flag=True, help="The same as `follow pending`.")
@click.option("--defer", is_flag=True, help="The same as `follow defer KREL` (with --kernel).")
@click.option("--removed", is_flag=True, help="The same as `follow removed KREL` (with --kernel).")
@click.option("--source", metavar="PATH|URL", help="Driver source for KREL instead of the distribution's.")
@_DRY_RUN
@_HOOK
@_JSON
@click.pass_context
def follow(ctx, kernel, run_pending, defer, removed, source, dry_run, hook, as_json):
    """Build, sign, VM-test and install the patched amdgpu for a new kernel (--kernel KREL), with the quirks
    installed now; the subcommands are what the package manager's hooks do."""
    if ctx.invoked_subcommand is not None:
        if kernel or run_pending or defer or removed or source or dry_run or hook or as_json:
            raise UsageError(f"options before `follow {ctx.invoked_subcommand}` are not read", "give them after it")
        return
    report(lambda: _follow(kernel, run_pending, defer, removed, source, dry_run), kernel, hook, as_json)


@follow.command("pending")
@_DRY_RUN
@_HOOK
@_JSON
def follow_pending(dry_run, hook, as_json):
    """Follow every kernel the hooks noted as pending (apt's hook and the boot unit run this)."""
    report(lambda: _follow(None, True, False, False, None, dry_run), None, hook, as_json)


@follow.command("defer")
@click.argument("kernel", metavar="KREL")
@_DRY_RUN
@_HOOK
@_JSON
def follow_defer(kernel, dry_run, hook, as_json):
    """Only note KREL as pending (what the kernel hooks do inside dpkg)."""
    report(lambda: _follow(kernel, False, True, False, None, dry_run), kernel, hook, as_json)


@follow.command("removed")
@click.argument("kernel", metavar="KREL")
@_DRY_RUN
@_HOOK
@_JSON
def follow_removed(kernel, dry_run, hook, as_json):
    """KREL was removed: drop its DKMS package, kbuild tree, journal and records.

    The files every kernel's install shares (the boot guard's, the stock loader's) go back to what was there
    before its install, unless a later install wrote them again: that install then takes the backup."""
    report(lambda: _follow(kernel, False, False, True, None, dry_run), kernel, hook, as_json)


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


def _follow(kernel, run_pending, defer, removed, source, dry_run) -> follow_modes.FollowResult:
    if run_pending == bool(kernel):
        raise UsageError(
            "give --kernel KREL, or one of the hooks' modes",
            "`follow pending`, `follow defer KREL`, `follow removed KREL`",
        )
    if defer and removed:
        raise UsageError("--defer and --removed exclude each other", "give one of them")
    if (defer or removed or run_pending) and source:
        raise UsageError("--source goes with a plain `follow --kernel`", "drop it")
    kernel = user_input.kernel_release(kernel) if kernel else None
    if removed:
        return follow_modes.removed(kernel, dry_run)
    if defer:
        return follow_modes.deferred(kernel, dry_run)
    return follow_modes.followed(None if run_pending else kernel, source, dry_run)
