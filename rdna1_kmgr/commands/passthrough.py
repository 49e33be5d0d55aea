"""The passthrough modes of `rdna1-kmgr vm-test` that need no build: `plumbing_mode` (`vm-test plumbing BDF`,
`vm-test --gpu BDF --plumbing-only`) and `restore_mode` (`vm-test restore`, `vm-test --restore`); and `run_gpu`,
the full GPU run of the build vm-test found."""

import click

from rdna1_kmgr.core.errors import BuildError, HostError, UsageError
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.vm import passthrough, plumbing_run
from rdna1_kmgr.vm.plumbing_facts import PlumbingRun


def restore_mode(as_json: bool) -> None:
    """Give back every device a killed run left on vfio-pci; exit 4 when one is not given back."""
    results = passthrough.restore_pending()
    if as_json:
        emit_json({"restored": results})
    elif not results:
        click.echo("no device left on vfio-pci by rdna1-kmgr")
    else:
        for entry in results:
            click.echo(("ok    " if entry.ok else "FAIL  ") + entry.detail)
    failed = [r for r in results if not r.ok]
    if failed:
        raise HostError(
            f"{len(failed)} device(s) not given back: {failed[0].detail}",
            "see above; a GPU that did not come back needs a power cycle",
        )


def plumbing_mode(gpu, kernel, accel, timeout, fetch, force, accept_reset_risk, as_json) -> None:
    """The device on vfio-pci, seen by a guest, given back; its record, written; exit 5 on a fail."""
    if timeout <= 0:
        raise UsageError(f"invalid --timeout {timeout:g}", "give a number of seconds > 0")
    done = plumbing_run.run_plumbing(
        gpu, release=kernel, accel=accel, timeout=timeout, fetch=fetch, force=force, accept_reset_risk=accept_reset_risk
    )
    record = done.record
    if as_json:
        emit_json(record.to_json())
    else:
        click.echo(report(done))
    if not record.passed:
        raise BuildError(f"vm-test failed: {record.reason}", f"record {record.record}")


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


def report(done: PlumbingRun) -> str:
    """A plumbing run as lines."""
    record, facts = done.record, done.facts
    lines = [
        f"verdict      {record.verdict}: {record.reason}",
        f"device       {facts.bdf} ({facts.vendor_device}), IOMMU group {facts.iommu_group}",
        f"guest saw    {facts.guest_saw or 'nothing'}",
    ]
    for dev in facts.devices:
        lines.append(
            f"  {dev.bdf}  before {dev.before or 'none'}, during {dev.during or 'none'}, "
            f"after {dev.after or 'none'}"
        )
    for check in record.checks:
        lines.append(f"  {'ok  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    lines.append(f"record       {record.record}")
    return "\n".join(lines)
