"""The passthrough modes of `rdna1-kmgr vm-test` that need no build: `plumbing_mode` (`vm-test plumbing BDF`) and
`restore_mode` (`vm-test restore`); `run_gpu`, the full GPU run of the build vm-test found; and what every mode
shares: the refusal of a limit that is no time, and the failure a failing verdict ends with."""

from rdna1_kmgr.core import output, user_input
from rdna1_kmgr.core.errors import BuildError, HostError
from rdna1_kmgr.vm import passthrough, plumbing_run, verdict
from rdna1_kmgr.vm.mode_results import RestoreResult
from rdna1_kmgr.vm.plumbing_facts import PlumbingRun


def restore_mode() -> output.Shown:
    """Give back every device a killed run left on vfio-pci; exit 4 when one is not given back."""
    result = RestoreResult(passthrough.restore_pending())
    failed = result.failed
    failure = (
        HostError(
            f"{len(failed)} device(s) not given back: {failed[0].detail}",
            "see above; a GPU that did not come back needs a power cycle",
        )
        if failed
        else None
    )
    return output.shown(result, restore_lines(result), failure=failure)


def restore_lines(result: RestoreResult) -> list[str]:
    if not result.restored:
        return ["no device left on vfio-pci by rdna1-kmgr"]
    return [("ok    " if entry.ok else "FAIL  ") + entry.detail for entry in result.restored]


def plumbing_mode(gpu, kernel, accel, timeout, fetch, force, accept_reset_risk) -> output.Shown:
    """The device on vfio-pci, seen by a guest, given back; its record, written; exit 5 on a fail."""
    user_input.positive_seconds("--timeout", timeout)
    done = plumbing_run.run_plumbing(
        gpu, release=kernel, accel=accel, timeout=timeout, fetch=fetch, force=force, accept_reset_risk=accept_reset_risk
    )
    return output.shown(done.record, report(done), failure=verdict_failure(done.record))


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


def verdict_failure(record: verdict.Record) -> BuildError | None:
    """How a mode ends after showing its record: exit 5 with the reason on a fail, nothing on a pass."""
    if record.passed:
        return None
    return BuildError(f"vm-test failed: {record.reason}", f"record {record.record}")


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
