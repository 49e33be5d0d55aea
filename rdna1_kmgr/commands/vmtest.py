"""`rdna1-kmgr vm-test`: prove the built module in a QEMU VM before the host loads it."""

import os
from pathlib import Path

import click

from rdna1_kmgr.commands.passthrough import dispatch as passthrough_dispatch
from rdna1_kmgr.commands.passthrough import passthrough_options, run_gpu
from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import BuildError, UsageError
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.modbuild import built_module
from rdna1_kmgr.modbuild.module_build import resolve_kernel
from rdna1_kmgr.vm import engine, experiment, experiment_board


@click.command("vm-test")
@click.option(
    "--kernel", metavar="KREL", help="Kernel to boot and whose build to test (default: the one `build` defaults to)."
)
@click.option(
    "--module",
    "module_path",
    metavar="KO",
    help="Test this module file instead of the build `build` left for the kernel.",
)
@click.option(
    "--manifest", metavar="FILE", help="The render's manifest.json for --module (gives the selftest case count)."
)
@click.option("--emulated", is_flag=True, help="Boot without a GPU (the default): module init, selftest, unload.")
@click.option(
    "--gpu",
    metavar="BDF|auto",
    help="Pass this RDNA1 GPU through to the VM (auto: the target board); any device with --plumbing-only.",
)
@click.option(
    "--accel",
    type=click.Choice(engine.ACCELS),
    default="auto",
    show_default=True,
    help="auto probes KVM briefly and falls back to TCG.",
)
@click.option(
    "--timeout",
    type=float,
    default=engine.DEFAULT_TIMEOUT,
    show_default=True,
    metavar="S",
    help="Hard limit in seconds for the guest run; QEMU is killed after it.",
)
@click.option(
    "--workload",
    type=click.Choice(["smoke", "conv2d"]),
    default="smoke",
    show_default=True,
    help="conv2d needs a passed-through GPU and torch in the guest.",
)
@click.option(
    "--matrix",
    is_flag=True,
    help="With --gpu: the experiment, quirk mask x user-space profile, conv2d against the CPU per cell.",
)
@click.option(
    "--cell-timeout",
    type=float,
    default=600,
    show_default=True,
    metavar="S",
    help="With --matrix: limit for one cell's workload; a cell over it is a hang.",
)
@click.option("--yes", is_flag=True, help="Download the kernel's image package into the cache when it is missing.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict record as JSON.")
@passthrough_options
def vmtest(
    kernel,
    module_path,
    manifest,
    emulated,
    gpu,
    accel,
    timeout,
    workload,
    matrix,
    cell_timeout,
    yes,
    as_json,
    plumbing_only,
    restore,
    accept_reset_risk,
    force,
):
    """Boot the kernel in QEMU (virtme-ng), load the module there, and record the verdict."""
    if timeout <= 0:
        raise UsageError(f"invalid --timeout {timeout:g}", "give a number of seconds > 0")
    if emulated and gpu:
        raise UsageError("--emulated and --gpu exclude each other", "give one of them")
    if manifest and not module_path:
        raise UsageError("--manifest goes with --module", "without --module the build's own manifest is used")
    if matrix and (not gpu or plumbing_only or restore):
        raise UsageError(
            "--matrix runs on the board",
            "give --gpu auto (or the board's address), without " "--plumbing-only or --restore",
        )
    if cell_timeout <= 0:
        raise UsageError(f"invalid --cell-timeout {cell_timeout:g}", "give a number of seconds > 0")
    if passthrough_dispatch(
        gpu, plumbing_only, restore, accept_reset_risk, force, kernel, accel, timeout, yes, as_json
    ):
        return
    if workload != "smoke" and not gpu:
        raise UsageError(f"the {workload} workload needs a GPU passed through", "use --gpu, or --workload smoke")
    release = user_input.kernel_release(kernel) if kernel else None
    if module_path:
        built = built_module.for_path(module_path, manifest)
    else:
        if release is None:
            release = resolve_kernel(None).release
            if release != os.uname().release:
                click.echo(
                    f"rdna1-kmgr: the running kernel {os.uname().release} is not the distribution's; "
                    f"testing the build for {release} (give --kernel to choose)",
                    err=True,
                )
        built = built_module.for_kernel(release)
    if matrix:
        return experiment_report(
            experiment_board.run(gpu, built, release, accel, cell_timeout, yes, force, accept_reset_risk), as_json
        )
    if gpu:
        record = run_gpu(gpu, built, release, accel, timeout, yes, force, accept_reset_risk, workload)
    else:
        record = engine.validate_module(
            built.path, release, accel=accel, timeout=timeout, fetch=yes, selftest_required=built.selftest_cases
        )
    if as_json:
        emit_json(record.to_json())
    else:
        for check in record.checks:
            click.echo(f"{'ok  ' if check.ok else 'FAIL'}  {check.name:15} {check.detail}")
        click.echo(
            f"verdict {record.verdict} ({record.mode}, {record.kernel}, {record.accel or 'not booted'}, "
            f"{record.seconds} s); record {record.record}"
        )
    if not record.passed:
        raise BuildError(f"vm-test failed: {record.reason}", f"record {record.record}")


def experiment_report(done: dict, as_json: bool) -> None:
    """The experiment's table (the host experiment's, experiment/answer.py), its grid as a page beside the record,
    and the recommendation; exit 5 when no cell passed."""
    results, best = done["results"], done["best"]
    rows = [answer.matrix_row(r) for r in results]
    lines = answer.table(rows) + [""] + experiment.recommendation_lines(best)
    page = answer.write_matrix_page(Path(done["record"]), rows, lines)
    if as_json:
        emit_json(
            {
                "record": done["record"],
                "html": str(page),
                "cells": [r.to_json() for r in results],
                "recommended": best.to_json() if best else None,
            }
        )
    else:
        click.echo("\n".join(lines + [f"record {done['record']}", f"the grid, to open in a browser: {page}"]))
    if best is None:
        raise BuildError("the experiment found no passing cell", f"see the table and the record {done['record']}")
