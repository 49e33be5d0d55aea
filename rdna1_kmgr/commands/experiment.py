"""`rdna1-kmgr experiment [apply]`: the user-space cells on the host, the table, the answer, and applying it."""

from pathlib import Path

import click

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.experiment import answer, apply as apply_answer, cell_run, host_run
from rdna1_kmgr.vm import cell_outcomes


@click.group(invoke_without_command=True)
@click.option("--python", "python", metavar="PATH",
              help="The python of your PyTorch (default: the first ROCm build doctor finds).")
@click.option("--profile", "profiles", multiple=True, metavar="NAME", help="Only these profiles (repeatable).")
@click.option("--backend", "backends", multiple=True, type=click.Choice(list(cell_outcomes.BACKENDS)),
              help="Only these backend settings (repeatable).")
@click.option("--cells", "pattern", metavar="GLOB", help="Only cells whose PROFILE/BACKEND id matches, e.g. 'no-override/*'.")
@click.option("--case-timeout", type=float, default=cell_run.Limits.case, show_default=True, metavar="S",
              help="A case with no progress (no new case, MIOpen's caches not growing) for this long is a hang.")
@click.option("--cell-timeout", type=float, default=cell_run.Limits.cell, show_default=True, metavar="S",
              help="Hard limit for one cell.")
@click.option("--quick", is_flag=True, help="Small shapes only (a first look).")
@click.option("--sysroot", default="/", show_default=True, metavar="DIR",
              help="Read the board and the kernel log under this tree (a fixture).")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@click.pass_context
def experiment(ctx, python, profiles, backends, pattern, case_timeout, cell_timeout, quick, sysroot, as_json):
    """Run the workload (smoke, Conv2d forward/backward against the CPU, ...) under every user-space profile
    and backend setting, each cell in a fresh process of your PyTorch with its own MIOpen caches; print the
    table and the smallest change that passes. Changes nothing on the system."""
    if ctx.invoked_subcommand is not None:
        return
    for name, value in (("--case-timeout", case_timeout), ("--cell-timeout", cell_timeout)):
        if value <= 0:
            raise UsageError(f"invalid {name} {value:g}", "give a number of seconds > 0")
    request = host_run.Request(python, user_input.existing_dir(sysroot, "sysroot"), tuple(profiles), tuple(backends),
                               pattern, cell_run.Limits(case_timeout, cell_timeout), quick)
    done = host_run.run(request, say=lambda line: click.echo(line, err=True),
                        warn=lambda line: click.echo(f"rdna1-kmgr: {line}", err=True))
    record = done["record"]
    if as_json:
        emit_json(record)
    else:
        rows = [answer.host_row(r) for r in done["results"]]
        click.echo("\n".join(answer.table(rows) + [""] + record["answer"]
                              + [f"table: {record['html']}", f"record: {Path(record['folder']) / 'record.json'}"]))
    if record.get("stopped"):
        ctx.exit(6)


@experiment.command("apply")
@click.option("--cell", "cell_id", metavar="PROFILE/BACKEND", help="A passing cell of the last run (default: the answer).")
@click.option("--dry-run", is_flag=True, help="Print the exact plan; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def apply(cell_id, dry_run, as_json):
    """Install the last experiment's answer: its profile through `profile install` (journaled; `rollback` or
    `profile remove` undoes it); a backend setting is printed as the line for your program."""
    result = apply_answer.apply(cell_id, dry_run)
    if as_json:
        emit_json(result)
        return
    installed = result["profile"]
    if installed is None:
        click.echo(f"{result['cell']}: no profile to install (it passes with your environment as it is)")
    else:
        click.echo("\n".join(installed["plan"] if dry_run else installed["done"]))
    if result["code"]:
        click.echo(f"in your program, after `import torch`: {result['code']}")
