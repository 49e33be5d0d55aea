"""`rdna1-kmgr experiment [apply]`: the user-space cells on the host, the table, the answer, and applying it."""

import sys
from pathlib import Path

import click

from rdna1_kmgr.core import output, progress, user_input
from rdna1_kmgr.core.errors import Exit
from rdna1_kmgr.experiment import answer, cell_run, host_run, kernel_run
from rdna1_kmgr.experiment import apply as apply_answer
from rdna1_kmgr.vm import cell_outcomes


@click.group(invoke_without_command=True)
@click.option(
    "--python",
    "python",
    metavar="PATH",
    help="The python of your PyTorch (default: the first ROCm build doctor finds).",
)
@click.option("--profile", "profiles", multiple=True, metavar="NAME", help="Only these profiles (repeatable).")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(list(cell_outcomes.BACKENDS)),
    help="Only these backend settings (repeatable).",
)
@click.option(
    "--cells", "pattern", metavar="GLOB", help="Only cells whose PROFILE/BACKEND id matches, e.g. 'no-override/*'."
)
@click.option(
    "--case-timeout",
    type=float,
    default=cell_run.Limits.case,
    show_default=True,
    metavar="S",
    help="A case with no progress (no new case, MIOpen's caches not growing) for this long is a hang.",
)
@click.option(
    "--cell-timeout",
    type=float,
    default=cell_run.Limits.cell,
    show_default=True,
    metavar="S",
    help="Hard limit for one cell.",
)
@click.option("--quick", is_flag=True, help="Small shapes only (a first look).")
@click.option(
    "--sysroot",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Read the board and the kernel log under this tree (a fixture).",
)
@output.json_option
@click.pass_context
def experiment(
    ctx, python, profiles, backends, pattern, case_timeout, cell_timeout, quick, sysroot
) -> output.Shown | None:
    """Run the workload (smoke, Conv2d forward/backward against the CPU, ...) under every user-space profile
    and backend setting, each cell in a fresh process of your PyTorch with its own MIOpen caches; print the
    table and the smallest change that passes. Changes nothing on the system."""
    if ctx.invoked_subcommand is not None:
        return None
    user_input.positive_seconds("--case-timeout", case_timeout)
    user_input.positive_seconds("--cell-timeout", cell_timeout)
    request = host_run.Request(
        python,
        user_input.existing_dir(sysroot, "sysroot"),
        tuple(profiles),
        tuple(backends),
        pattern,
        cell_run.Limits(case_timeout, cell_timeout),
        quick,
    )
    done = host_run.run(request)
    rows = [answer.host_row(r) for r in done.results]
    lines = (
        answer.table(rows)
        + [""]
        + done.answer
        + [f"table: {done.html}", f"record: {Path(done.folder) / 'record.json'}"]
    )
    # The run's record.json is its --json (answer.write builds it); a lost GPU or a dead end ends with its code.
    ended = Exit.GPU_LOST if done.stopped else Exit.HOST if done.dead_end else 0
    return output.shown(done.record, lines, exit_code=int(ended))


@experiment.command("apply")
@click.option(
    "--cell", "cell_id", metavar="PROFILE/BACKEND", help="A passing cell of the last run (default: the answer)."
)
@click.option(
    "--kernel-cell",
    "kernel_cell",
    metavar="NAME",
    help="A kernel cell that passed in the last kernel cells' run (instead of the user-space answer).",
)
@click.option("--kernel", "kernel_answer", is_flag=True, help="The kernel cells' answer (the smallest that passed).")
@click.option("--dry-run", is_flag=True, help="Print the exact plan; change nothing.")
@output.json_option
def apply(cell_id, kernel_cell, kernel_answer, dry_run) -> output.Shown:
    """Install the last experiment's answer: its profile through `profile install` (journaled; `rollback` or
    `profile remove` undoes it); a backend setting is printed as the line for your program. With --kernel or
    --kernel-cell: a quirk mask through `install --quirks`, a stock amdgpu parameter on every boot's command
    line through GRUB (journaled; `rollback` undoes it)."""
    if kernel_cell or kernel_answer:
        on_boot = apply_answer.apply_kernel(kernel_cell, dry_run)
        return output.shown(on_boot, on_boot.lines())
    result = apply_answer.apply(cell_id, dry_run)
    if result.profile is None:
        lines = [f"{result.cell}: no profile to install (it passes with your environment as it is)"]
    else:
        lines = result.profile_lines()
    if result.code:
        lines.append(f"in your program, after `import torch`: {result.code}")
    return output.shown(result, lines)


@experiment.command("kernel")
@click.option("--python", "python", metavar="PATH", help="The python of your PyTorch (default: as stage 1's).")
@click.option(
    "--kernel-cell",
    "kernel_cells",
    multiple=True,
    metavar="NAME",
    help="Only these kernel cells (repeatable; default: every one; `--dry-run` lists them).",
)
@click.option(
    "--cells",
    "pattern",
    metavar="GLOB",
    help="The host cells each boot runs (default: stage 1's best two, else as-installed/miopen).",
)
@click.option("--case-timeout", type=float, default=cell_run.Limits.case, show_default=True, metavar="S")
@click.option("--cell-timeout", type=float, default=cell_run.Limits.cell, show_default=True, metavar="S")
@click.option("--quick", is_flag=True, help="Small shapes only.")
@click.option("--reboot", is_flag=True, help="Reboot by itself into each next cell (default: you reboot).")
@click.option("--sysroot", default="/", show_default=True, metavar="DIR", help="Read the board under this tree.")
@click.option("--dry-run", is_flag=True, help="Print the cells and the boot files; change nothing.")
@output.json_option
def kernel(python, kernel_cells, pattern, case_timeout, cell_timeout, quick, reboot, sysroot, dry_run) -> output.Shown:
    """The kernel axis, on this desktop: one boot per kernel cell (a stock amdgpu parameter, or a quirk mask of
    the installed build) on the command line of that boot only, through GRUB. Each cell's boot runs stage 1's
    best cells, records them and arms the next; a boot that hangs is recorded as a hang and followed by a normal
    one. Journaled: `experiment stop` or `rollback` undo it."""
    user_input.positive_seconds("--case-timeout", case_timeout)
    user_input.positive_seconds("--cell-timeout", cell_timeout)
    request = kernel_run.Request(
        python,
        user_input.existing_dir(sysroot, "sysroot"),
        tuple(kernel_cells),
        pattern,
        cell_run.Limits(case_timeout, cell_timeout),
        quick,
        reboot,
    )
    result = kernel_run.start(request, dry_run)
    return output.shown(result, result.plan)


@experiment.command("status")
@output.json_option
def status() -> output.Shown:
    """Where the kernel cells' boots are: each cell done (its outcomes), armed, or waiting."""
    result = kernel_run.status()
    return output.shown(result, _status_lines(result))


def _status_lines(result: kernel_run.CellsUnderWay | kernel_run.NoCellsUnderWay) -> list[str]:
    """No cells under way (and the last run's table and answer), or each cell's state."""
    if isinstance(result, kernel_run.NoCellsUnderWay):
        last = result.last_run()
        said = "no experiment's kernel cells are under way" + (f"; the last one ({last[0]}):" if last else "")
        return [said, *(last[1] if last else [])]
    lines = [f"kernel cells under way ({result.folder}); host cells: {', '.join(result.host_cells)}"]
    for n, cell in enumerate(result.cells, 1):
        outcomes = f": {' '.join(cell.outcomes)}" if cell.outcomes else ""
        lines.append(f"  {n}. {cell.cell:16} {cell.parameter:28} {cell.state}{outcomes}")
    return lines


@experiment.command("stop")
@click.option("--dry-run", is_flag=True, help="Print what is undone; change nothing.")
@output.json_option
def stop(dry_run) -> output.Shown:
    """End the kernel cells now: the next boot is a normal one; the boot files, GRUB's lines and variables are
    removed (the journal's replay). What ran is kept in the record."""
    result = kernel_run.stop(dry_run)
    if result.message is not None:
        return output.shown(result, [result.message])
    # Ended for real: the run's table and answer went to progress as it ended (kernel_run.end).
    return output.shown(result, (result.plan or []) if dry_run else [])


@experiment.command("boot-step", hidden=True)
def boot_step():
    """Run by rdna1-kmgr-experiment.service at every boot while kernel cells are under way."""
    with progress.reporting_to(sys.stdout):  # the unit's output: the journal keeps it
        kernel_run.boot_step()
