"""`rdna1-kmgr follow`: the patched amdgpu for a newly installed kernel (what the kernel hooks call)."""

from collections.abc import Callable
from dataclasses import dataclass

import click

from rdna1_kmgr.core import output, user_input
from rdna1_kmgr.core.errors import KmgrError, UsageError
from rdna1_kmgr.follow import follow_modes, follow_record, kernel_follow

_HOOK = click.option(
    "--hook",
    is_flag=True,
    help="As the package manager's hooks run it: exit status 0 whatever happens, one line per kernel.",
)
_DRY_RUN = click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")


@click.group(invoke_without_command=True)
@click.option("--kernel", metavar="KREL", help="The kernel to follow.")
@click.option("--source", metavar="PATH|URL", help="Driver source for KREL instead of the distribution's.")
@_DRY_RUN
@_HOOK
@output.json_option
@click.pass_context
def follow(ctx, kernel, source, dry_run, hook) -> output.Shown | None:
    """Build, sign, VM-test and install the patched amdgpu for a new kernel (--kernel KREL), with the quirks
    installed now; the subcommands are what the package manager's hooks do."""
    if ctx.invoked_subcommand is not None:
        # The group's own --json (its subcommand's is not parsed yet).
        if kernel or source or dry_run or hook or ctx.meta.get(output.WANTS_JSON):
            raise UsageError(f"options before `follow {ctx.invoked_subcommand}` are not read", "give them after it")
        return None
    return report(lambda: follow_modes.followed(_release(kernel), source, dry_run), kernel, hook)


@follow.command("pending")
@_DRY_RUN
@_HOOK
@output.json_option
def follow_pending(dry_run, hook) -> output.Shown:
    """Follow every kernel the hooks noted as pending (apt's hook and the boot unit run this)."""
    return report(lambda: follow_modes.followed(None, None, dry_run), None, hook)


@follow.command("defer")
@click.argument("kernel", metavar="KREL")
@_DRY_RUN
@_HOOK
@output.json_option
def follow_defer(kernel, dry_run, hook) -> output.Shown:
    """Only note KREL as pending (what the kernel hooks do inside dpkg)."""
    return report(lambda: follow_modes.deferred(user_input.kernel_release(kernel), dry_run), kernel, hook)


@follow.command("removed")
@click.argument("kernel", metavar="KREL")
@_DRY_RUN
@_HOOK
@output.json_option
def follow_removed(kernel, dry_run, hook) -> output.Shown:
    """KREL was removed: drop its DKMS package, kbuild tree, journal and records.

    The files every kernel's install shares (the boot guard's, the stock loader's) go back to what was there
    before its install, unless a later install wrote them again: that install then takes the backup."""
    return report(lambda: follow_modes.removed(user_input.kernel_release(kernel), dry_run), kernel, hook)


@dataclass(frozen=True)
class HookFailure:
    """Under --hook, a mode that failed: its one line (the reason is in the kernel's record and the log); the
    command still exits 0, for the package manager must go on."""

    kernel: str | None
    line: str


def report(work: Callable[[], follow_modes.FollowResult], kernel: str | None, hook: bool) -> output.Shown:
    """Run one mode of follow and say its result; under --hook, one line and exit 0 whatever happens."""
    try:
        result = work()
    except KmgrError as err:
        if not hook:
            raise
        record = follow_record.read(kernel) if kernel and isinstance(err, kernel_follow.StageFailed) else None
        line = f"rdna1-kmgr: {kernel or 'follow'}: {follow_record.describe(record) or err.line()}"
        return output.shown(HookFailure(kernel, line), [line])
    lines = result.plan if isinstance(result, follow_modes.FollowPlan) else result.lines
    failed = result.failed if isinstance(result, follow_modes.Followed) and not hook else 0
    return output.shown(result, lines, exit_code=failed)


def _release(kernel: str | None) -> str:
    """A plain `follow`'s kernel, checked (inside `report`: under --hook a bad one is a line, not a failure)."""
    if not kernel:
        raise UsageError(
            "give --kernel KREL, or one of the hooks' modes",
            "`follow pending`, `follow defer KREL`, `follow removed KREL`",
        )
    return user_input.kernel_release(kernel)
