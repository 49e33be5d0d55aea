"""The passthrough side of `rdna1-kmgr vm-test`: --gpu, --plumbing-only, --restore, --accept-reset-risk, --force.

`passthrough_options` adds the options to the vm-test command; `dispatch` runs the invocations that are
passthrough's alone (`--restore`, `--plumbing-only`) and tells vm-test whether it still has work to do;
`run_gpu` is the full GPU run of the build vm-test found.
"""

import click

from rdna1_kmgr.core.errors import BuildError, HostError, UsageError
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.vm import passthrough, plumbing_run

_OPTIONS = (
    click.option(
        "--plumbing-only",
        is_flag=True,
        help="With --gpu: check only the VFIO plumbing (bound, seen by the guest, given back); "
        "any PCI device will do. Try it with a harmless device before the GPU.",
    ),
    click.option("--restore", is_flag=True, help="Give back every device a killed run left on vfio-pci, then exit."),
    click.option(
        "--accept-reset-risk",
        is_flag=True,
        help="Pass a board with the AMD reset bug without vendor-reset's device_specific reset; it may "
        "stay dead until a power cycle. Recorded in the verdict.",
    ),
    click.option(
        "--force",
        is_flag=True,
        help="Pass a GPU that drives this host's display (boot VGA, or its DRM card held open).",
    ),
)


def passthrough_options(command):
    """Decorate vm-test with the passthrough options (not --gpu: vm-test has it beside --emulated)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def dispatch(gpu, plumbing_only, restore, accept_reset_risk, force, kernel, accel, timeout, yes, as_json) -> bool:
    """Run what passthrough does alone; True when done, False when vm-test goes on with its emulated run."""
    if restore:
        if gpu or plumbing_only:
            raise UsageError("--restore takes no --gpu or --plumbing-only", "run `rdna1-kmgr vm-test --restore` alone")
        results = passthrough.restore_pending()
        if as_json:
            emit_json({"restored": results})
        elif not results:
            click.echo("no device left on vfio-pci by rdna1-kmgr")
        else:
            for entry in results:
                click.echo(("ok    " if entry["ok"] else "FAIL  ") + entry["detail"])
        failed = [r for r in results if not r["ok"]]
        if failed:
            raise HostError(
                f"{len(failed)} device(s) not given back: {failed[0]['detail']}",
                "see above; a GPU that did not come back needs a power cycle",
            )
        return True
    if plumbing_only and not gpu:
        raise UsageError(
            "--plumbing-only needs --gpu BDF", "e.g. rdna1-kmgr vm-test --gpu 0000:05:00.0 --plumbing-only"
        )
    if (accept_reset_risk or force) and not gpu:
        raise UsageError("--accept-reset-risk and --force only apply with --gpu", "add --gpu BDF|auto")
    if not gpu:
        return False
    if not plumbing_only:
        # The full GPU run: vm-test finds the build, then calls run_gpu. A host with no such board, or a
        # bad address, is refused now, before a missing build could hide it.
        passthrough.resolve_gpu(gpu)
        return False
    result = plumbing_run.run_plumbing(
        gpu, release=kernel, accel=accel, timeout=timeout, fetch=yes, force=force, accept_reset_risk=accept_reset_risk
    )
    if as_json:
        emit_json(result)
    else:
        click.echo(report(result))
    if result["verdict"] != "pass":
        raise BuildError(f"vm-test failed: {result['reason']}", f"record {result['record']}")
    return True


def run_gpu(gpu, built, release, accel, timeout, yes, force, accept_reset_risk, workload):
    """The full GPU run of a build (builds.BuiltModule): its record, written; exit 5 is vm-test's, on a fail."""
    # the bits the module turns on by itself (it is loaded without rdna1_quirks); older manifests: every quirk
    active = built.manifest.active_by_default if built.manifest else None
    quirks = list(active) if active is not None else None
    return passthrough.run_gpu(
        gpu,
        built.path,
        quirks,
        release=release,
        accel=accel,
        timeout=timeout,
        fetch=yes,
        force=force,
        accept_reset_risk=accept_reset_risk,
        workload=workload,
        selftest_required=built.selftest_cases,
    )


def report(result: dict) -> str:
    lines = [
        f"verdict      {result['verdict']}: {result['reason']}",
        f"device       {result['device']} ({result['vendor_device']}), IOMMU group {result['iommu_group']}",
        f"guest saw    {result['guest_saw'] or 'nothing'}",
    ]
    for dev in result["devices"]:
        lines.append(
            f"  {dev['bdf']}  before {dev['before'] or 'none'}, during {dev['during'] or 'none'}, "
            f"after {dev['after'] or 'none'}"
        )
    for check in result["checks"]:
        lines.append(f"  {'ok  ' if check['ok'] else 'FAIL'}  {check['name']}: {check['detail']}")
    lines.append(f"record       {result['record']}")
    return "\n".join(lines)
