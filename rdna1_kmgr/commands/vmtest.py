"""`rdna1-kmgr vm-test`: prove the built module in a QEMU VM before the host loads it.

One function per mode (`emulated_mode`, `gpu_mode`, `matrix_mode`, and passthrough's `plumbing_mode`,
`restore_mode`), reached two ways: the subcommands (`vm-test emulated`, `vm-test gpu BDF`, `vm-test matrix BDF`,
`vm-test plumbing BDF`, `vm-test restore`), each with only its own options, and the flags of the bare command
(`--emulated`, `--gpu BDF [--matrix | --plumbing-only]`, `--restore`), which the hooks and scripts use.
"""

import os

import click
from click.core import ParameterSource

from rdna1_kmgr.commands.passthrough import plumbing_mode, restore_mode, run_gpu
from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import BuildError, UsageError
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.modbuild import built_module
from rdna1_kmgr.source.target_kernel import resolve_kernel
from rdna1_kmgr.vm import engine, experiment, experiment_board, passthrough

_KERNEL = click.option(
    "--kernel", metavar="KREL", help="Kernel to boot and whose build to test (default: the one `build` defaults to)."
)
_MODULE = click.option(
    "--module",
    "module_path",
    metavar="KO",
    help="Test this module file instead of the build `build` left for the kernel.",
)
_MANIFEST = click.option(
    "--manifest", metavar="FILE", help="The render's manifest.json for --module (gives the selftest case count)."
)
_ACCEL = click.option(
    "--accel",
    type=click.Choice(engine.ACCELS),
    default="auto",
    show_default=True,
    help="auto probes KVM briefly and falls back to TCG.",
)
_TIMEOUT = click.option(
    "--timeout",
    type=float,
    default=engine.DEFAULT_TIMEOUT,
    show_default=True,
    metavar="S",
    help="Hard limit in seconds for the guest run; QEMU is killed after it.",
)
_WORKLOAD = click.option(
    "--workload",
    type=click.Choice(["smoke", "conv2d"]),
    default="smoke",
    show_default=True,
    help="conv2d needs a passed-through GPU and torch in the guest.",
)
_CELL_TIMEOUT = click.option(
    "--cell-timeout",
    type=float,
    default=600,
    show_default=True,
    metavar="S",
    help="The matrix: limit for one cell's workload; a cell over it is a hang.",
)
_YES = click.option(
    "--yes", is_flag=True, help="Download the kernel's image package into the cache when it is missing."
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the verdict record as JSON.")
_ACCEPT_RESET_RISK = click.option(
    "--accept-reset-risk",
    is_flag=True,
    help="Pass a board with the AMD reset bug without vendor-reset's device_specific reset; it may "
    "stay dead until a power cycle. Recorded in the verdict.",
)
_FORCE = click.option(
    "--force", is_flag=True, help="Pass a GPU that drives this host's display (boot VGA, or its DRM card held open)."
)
_DEVICE = click.argument("gpu", metavar="BDF|auto")


def _options(*decorators):
    def apply(command):
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


_BUILD = _options(_KERNEL, _MODULE, _MANIFEST)
_PASSING = _options(_ACCEPT_RESET_RISK, _FORCE)


@click.group("vm-test", invoke_without_command=True)
@_BUILD
@click.option("--emulated", is_flag=True, help="Boot without a GPU (the default): module init, selftest, unload.")
@click.option(
    "--gpu",
    metavar="BDF|auto",
    help="Pass this RDNA1 GPU through to the VM (auto: the target board); any device with --plumbing-only.",
)
@_ACCEL
@_TIMEOUT
@_WORKLOAD
@click.option("--matrix", is_flag=True, help="With --gpu: the same as `vm-test matrix BDF`.")
@_CELL_TIMEOUT
@_YES
@_JSON
@click.option("--plumbing-only", is_flag=True, help="With --gpu: the same as `vm-test plumbing BDF`.")
@click.option("--restore", is_flag=True, help="The same as `vm-test restore`.")
@_PASSING
@click.pass_context
def vmtest(
    ctx,
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
    """Boot the kernel in QEMU, load the module there, and record the verdict (emulated when no mode is given)."""
    if ctx.invoked_subcommand is not None:
        given = [name for name in ctx.params if ctx.get_parameter_source(name) != ParameterSource.DEFAULT]
        if given:
            raise UsageError(f"options before `vm-test {ctx.invoked_subcommand}` are not read", "give them after it")
        return
    # Today's order of refusals, whatever the mode.
    _positive("--timeout", timeout)
    if emulated and gpu:
        raise UsageError("--emulated and --gpu exclude each other", "give one of them")
    if manifest and not module_path:
        raise UsageError("--manifest goes with --module", "without --module the build's own manifest is used")
    if matrix and (not gpu or plumbing_only or restore):
        raise UsageError(
            "--matrix runs on the board",
            "give --gpu auto (or the board's address), without --plumbing-only or --restore",
        )
    _positive("--cell-timeout", cell_timeout)
    if restore:
        if gpu or plumbing_only:
            raise UsageError("--restore takes no --gpu or --plumbing-only", "run `rdna1-kmgr vm-test --restore` alone")
        return restore_mode(as_json)
    if plumbing_only and not gpu:
        raise UsageError(
            "--plumbing-only needs --gpu BDF", "e.g. rdna1-kmgr vm-test --gpu 0000:05:00.0 --plumbing-only"
        )
    if (accept_reset_risk or force) and not gpu:
        raise UsageError("--accept-reset-risk and --force only apply with --gpu", "add --gpu BDF|auto")
    if plumbing_only:
        return plumbing_mode(gpu, kernel, accel, timeout, yes, force, accept_reset_risk, as_json)
    if matrix:
        return matrix_mode(
            gpu, kernel, module_path, manifest, accel, cell_timeout, yes, force, accept_reset_risk, as_json
        )
    if gpu:
        return gpu_mode(
            gpu, kernel, module_path, manifest, accel, timeout, workload, yes, force, accept_reset_risk, as_json
        )
    if workload != "smoke":
        raise UsageError(f"the {workload} workload needs a GPU passed through", "use --gpu, or --workload smoke")
    return emulated_mode(kernel, module_path, manifest, accel, timeout, yes, as_json)


@vmtest.command("emulated")
@_BUILD
@_ACCEL
@_TIMEOUT
@_YES
@_JSON
def vmtest_emulated(kernel, module_path, manifest, accel, timeout, yes, as_json):
    """Boot without a GPU: module init, selftest, reload without quirks, unload (what bare `vm-test` does)."""
    emulated_mode(kernel, module_path, manifest, accel, timeout, yes, as_json)


@vmtest.command("gpu")
@_DEVICE
@_BUILD
@_ACCEL
@_TIMEOUT
@_WORKLOAD
@_YES
@_JSON
@_PASSING
def vmtest_gpu(gpu, kernel, module_path, manifest, accel, timeout, workload, yes, as_json, accept_reset_risk, force):
    """Every emulated check in a guest the RDNA1 GPU BDF (auto: the target board) is passed to, plus the GPU's own."""
    gpu_mode(gpu, kernel, module_path, manifest, accel, timeout, workload, yes, force, accept_reset_risk, as_json)


@vmtest.command("matrix")
@_DEVICE
@_BUILD
@_ACCEL
@_CELL_TIMEOUT
@_YES
@_JSON
@_PASSING
def vmtest_matrix(gpu, kernel, module_path, manifest, accel, cell_timeout, yes, as_json, accept_reset_risk, force):
    """The experiment on the board BDF: quirk mask x user-space profile, conv2d against the CPU per cell."""
    matrix_mode(gpu, kernel, module_path, manifest, accel, cell_timeout, yes, force, accept_reset_risk, as_json)


@vmtest.command("plumbing")
@_DEVICE
@_KERNEL
@_ACCEL
@_TIMEOUT
@_YES
@_JSON
@_PASSING
def vmtest_plumbing(gpu, kernel, accel, timeout, yes, as_json, accept_reset_risk, force):
    """Only the VFIO plumbing: BDF (any PCI device) bound to vfio-pci, seen by a guest, given back. Try a
    harmless device before the GPU."""
    plumbing_mode(gpu, kernel, accel, timeout, yes, force, accept_reset_risk, as_json)


@vmtest.command("restore")
@_JSON
def vmtest_restore(as_json):
    """Give back every device a killed run left on vfio-pci."""
    restore_mode(as_json)


# --- the modes ----------------------------------------------------------------------------------------------------


def emulated_mode(kernel, module_path, manifest, accel, timeout, fetch, as_json) -> None:
    """The module in a guest without a GPU; its record, written; exit 5 on a fail."""
    _positive("--timeout", timeout)
    built, release = find_build(kernel, module_path, manifest)
    record = engine.validate_module(
        built.path, release, accel=accel, timeout=timeout, fetch=fetch, selftest_required=built.selftest_cases
    )
    verdict_report(record, as_json)


def gpu_mode(gpu, kernel, module_path, manifest, accel, timeout, workload, fetch, force, accept_reset_risk, as_json):
    """The module in a guest that drives the passed-through board; its record, written; exit 5 on a fail."""
    _positive("--timeout", timeout)
    # A host with no such board, a bad address or another device is refused now, before a missing build could
    # hide it.
    passthrough.require_rdna1(passthrough.resolve_gpu(gpu))
    built, release = find_build(kernel, module_path, manifest)
    record = run_gpu(gpu, built, release, accel, timeout, fetch, force, accept_reset_risk, workload)
    verdict_report(record, as_json)


def matrix_mode(gpu, kernel, module_path, manifest, accel, cell_timeout, fetch, force, accept_reset_risk, as_json):
    """The experiment on the board: its table and record; exit 5 when no cell passed."""
    _positive("--cell-timeout", cell_timeout)
    passthrough.require_rdna1(passthrough.resolve_gpu(gpu))
    built, release = find_build(kernel, module_path, manifest)
    experiment_report(
        experiment_board.run(gpu, built, release, accel, cell_timeout, fetch, force, accept_reset_risk), as_json
    )


def find_build(kernel, module_path, manifest) -> tuple[built_module.BuiltModule, str | None]:
    """The module under test: the file given, or the build `build` left for the kernel; and the kernel."""
    if manifest and not module_path:
        raise UsageError("--manifest goes with --module", "without --module the build's own manifest is used")
    release = user_input.kernel_release(kernel) if kernel else None
    if module_path:
        return built_module.for_path(module_path, manifest), release
    if release is None:
        release = resolve_kernel(None).release
        if release != os.uname().release:
            click.echo(
                f"rdna1-kmgr: the running kernel {os.uname().release} is not the distribution's; "
                f"testing the build for {release} (give --kernel to choose)",
                err=True,
            )
    return built_module.for_kernel(release), release


def _positive(option: str, seconds: float) -> None:
    if seconds <= 0:
        raise UsageError(f"invalid {option} {seconds:g}", "give a number of seconds > 0")


def verdict_report(record, as_json: bool) -> None:
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


def experiment_report(done: experiment_board.BoardExperiment, as_json: bool) -> None:
    """The experiment's table (the host experiment's, experiment/answer.py), its grid as a page beside the record,
    and the recommendation; exit 5 when no cell passed."""
    rows = [answer.matrix_row(r) for r in done.results]
    lines = answer.table(rows) + [""] + experiment.recommendation_lines(done.best)
    page = answer.write_matrix_page(done.record, rows, lines)
    if as_json:
        emit_json(
            {
                "record": str(done.record),
                "html": str(page),
                "cells": [r.to_json() for r in done.results],
                "recommended": done.best.to_json() if done.best else None,
            }
        )
    else:
        click.echo("\n".join(lines + [f"record {done.record}", f"the grid, to open in a browser: {page}"]))
    if done.best is None:
        raise BuildError("the experiment found no passing cell", f"see the table and the record {done.record}")
