"""`rdna1-kmgr vm-test`: prove the built module in a QEMU VM before the host loads it.

One subcommand per mode, each with only its own options, each reaching one function: `vm-test emulated`
(`emulated_mode`), `vm-test gpu BDF` (`gpu_mode`), `vm-test matrix BDF` (`matrix_mode`), and passthrough's
`vm-test plumbing BDF` (`plumbing_mode`) and `vm-test restore` (`restore_mode`). Bare `vm-test` is the emulated
test, with the emulated test's options. Each mode returns what it shows (its record, or its result, and the
failure a failing verdict ends with).
"""

import os

import click
from click.core import ParameterSource

from rdna1_kmgr.commands.passthrough import plumbing_mode, restore_mode, run_gpu, verdict_failure
from rdna1_kmgr.core import output, progress, user_input
from rdna1_kmgr.core.errors import BuildError, UsageError
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.modbuild import built_module
from rdna1_kmgr.source.target_kernel import resolve_kernel
from rdna1_kmgr.vm import engine, experiment, experiment_board, passthrough, verdict
from rdna1_kmgr.vm.mode_results import MatrixResult

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
@_ACCEL
@_TIMEOUT
@_YES
@output.json_option
@click.pass_context
def vmtest(ctx, kernel, module_path, manifest, accel, timeout, yes) -> output.Shown | None:
    """Boot the kernel in QEMU, load the module there, and record the verdict (emulated when no mode is given)."""
    if ctx.invoked_subcommand is not None:
        if _given_options(ctx):
            raise UsageError(f"options before `vm-test {ctx.invoked_subcommand}` are not read", "give them after it")
        return None
    return emulated_mode(kernel, module_path, manifest, accel, timeout, yes)


def _given_options(ctx: click.Context) -> list[str]:
    """The group's options given on the command line (--json too, which the command never sees as a value)."""
    return [
        p.name
        for p in ctx.command.params
        if p.name and ctx.get_parameter_source(p.name) not in (None, ParameterSource.DEFAULT)
    ]


@vmtest.command("emulated")
@_BUILD
@_ACCEL
@_TIMEOUT
@_YES
@output.json_option
def vmtest_emulated(kernel, module_path, manifest, accel, timeout, yes) -> output.Shown:
    """Boot without a GPU: module init, selftest, reload without quirks, unload (what bare `vm-test` does)."""
    return emulated_mode(kernel, module_path, manifest, accel, timeout, yes)


@vmtest.command("gpu")
@_DEVICE
@_BUILD
@_ACCEL
@_TIMEOUT
@_WORKLOAD
@_YES
@output.json_option
@_PASSING
def vmtest_gpu(
    gpu, kernel, module_path, manifest, accel, timeout, workload, yes, accept_reset_risk, force
) -> output.Shown:
    """Every emulated check in a guest the RDNA1 GPU BDF (auto: the target board) is passed to, plus the GPU's own."""
    return gpu_mode(gpu, kernel, module_path, manifest, accel, timeout, workload, yes, force, accept_reset_risk)


@vmtest.command("matrix")
@_DEVICE
@_BUILD
@_ACCEL
@_CELL_TIMEOUT
@_YES
@output.json_option
@_PASSING
def vmtest_matrix(
    gpu, kernel, module_path, manifest, accel, cell_timeout, yes, accept_reset_risk, force
) -> output.Shown:
    """The experiment on the board BDF: quirk mask x user-space profile, conv2d against the CPU per cell."""
    return matrix_mode(gpu, kernel, module_path, manifest, accel, cell_timeout, yes, force, accept_reset_risk)


@vmtest.command("plumbing")
@_DEVICE
@_KERNEL
@_ACCEL
@_TIMEOUT
@_YES
@output.json_option
@_PASSING
def vmtest_plumbing(gpu, kernel, accel, timeout, yes, accept_reset_risk, force) -> output.Shown:
    """Only the VFIO plumbing: BDF (any PCI device) bound to vfio-pci, seen by a guest, given back. Try a
    harmless device before the GPU."""
    return plumbing_mode(gpu, kernel, accel, timeout, yes, force, accept_reset_risk)


@vmtest.command("restore")
@output.json_option
def vmtest_restore() -> output.Shown:
    """Give back every device a killed run left on vfio-pci."""
    return restore_mode()


# --- the modes ----------------------------------------------------------------------------------------------------


def emulated_mode(kernel, module_path, manifest, accel, timeout, fetch) -> output.Shown:
    """The module in a guest without a GPU; its record, written; exit 5 on a fail."""
    user_input.positive_seconds("--timeout", timeout)
    built, release = find_build(kernel, module_path, manifest)
    record = engine.validate_module(
        built.path, release, accel=accel, timeout=timeout, fetch=fetch, selftest_required=built.selftest_cases
    )
    return verdict_report(record)


def gpu_mode(
    gpu, kernel, module_path, manifest, accel, timeout, workload, fetch, force, accept_reset_risk
) -> output.Shown:
    """The module in a guest that drives the passed-through board; its record, written; exit 5 on a fail."""
    user_input.positive_seconds("--timeout", timeout)
    # A host with no such board, a bad address or another device is refused now, before a missing build could
    # hide it.
    passthrough.require_rdna1(passthrough.resolve_gpu(gpu))
    built, release = find_build(kernel, module_path, manifest)
    record = run_gpu(gpu, built, release, accel, timeout, fetch, force, accept_reset_risk, workload)
    return verdict_report(record)


def matrix_mode(
    gpu, kernel, module_path, manifest, accel, cell_timeout, fetch, force, accept_reset_risk
) -> output.Shown:
    """The experiment on the board: its table and record; exit 5 when no cell passed."""
    user_input.positive_seconds("--cell-timeout", cell_timeout)
    passthrough.require_rdna1(passthrough.resolve_gpu(gpu))
    built, release = find_build(kernel, module_path, manifest)
    return experiment_report(
        experiment_board.run(gpu, built, release, accel, cell_timeout, fetch, force, accept_reset_risk)
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
            progress.say(
                f"rdna1-kmgr: the running kernel {os.uname().release} is not the distribution's; "
                f"testing the build for {release} (give --kernel to choose)"
            )
    return built_module.for_kernel(release), release


def verdict_report(record: verdict.Record) -> output.Shown:
    """A verdict record shown: its checks and its verdict line (--json: the record); exit 5 on a fail."""
    lines = [f"{'ok  ' if check.ok else 'FAIL'}  {check.name:15} {check.detail}" for check in record.checks]
    lines.append(
        f"verdict {record.verdict} ({record.mode}, {record.kernel}, {record.accel or 'not booted'}, "
        f"{record.seconds} s); record {record.record}"
    )
    return output.shown(record, lines, failure=verdict_failure(record))


def experiment_report(done: experiment_board.BoardExperiment) -> output.Shown:
    """The experiment's table (the host experiment's, experiment/answer.py), its grid as a page beside the record,
    and the recommendation; exit 5 when no cell passed."""
    rows = [answer.matrix_row(r) for r in done.results]
    lines = answer.table(rows) + [""] + experiment.recommendation_lines(done.best)
    page = answer.write_matrix_page(done.record, rows, lines)
    result = MatrixResult(record=done.record, html=page, cells=done.results, recommended=done.best)
    failure = (
        BuildError("the experiment found no passing cell", f"see the table and the record {done.record}")
        if done.best is None
        else None
    )
    text = lines + [f"record {done.record}", f"the grid, to open in a browser: {page}"]
    return output.shown(result, text, failure=failure)
