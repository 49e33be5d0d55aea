"""A plumbing-only run (`vm-test plumbing BDF`): any PCI device handed to
vfio-pci, seen by a tiny guest, given back, and a verdict on that plumbing alone (a verdict.Record, mode
plumbing, beside the console log).

The guest is plain QEMU with the busybox initramfs of plumbing_guest.py, not virtme-ng: it only has to list
its PCI devices, and it must be quick under TCG and inside another guest. The tests use QEMU's `edu` device
inside a guest with an emulated IOMMU.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from rdna1_kmgr import __version__
from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.paths import log_dir
from rdna1_kmgr.host import sysfs
from rdna1_kmgr.vm import engine, guest_kernel, guest_registry, plumbing_guest, verdict, vfio
from rdna1_kmgr.vm.guest import GuestRequest, GuestRun
from rdna1_kmgr.vm.passthrough import (
    _NO_IRQ_REMAP,
    Preflight,
    Session,
    _id,
    bound,
    preflight,
    require_root,
    resolve_gpu,
)
from rdna1_kmgr.vm.plumbing_facts import DeviceStory, PlumbingFacts, PlumbingRun
from rdna1_kmgr.vm.qemu_args import ROOT_PORT_IDS

GUEST = plumbing_guest.NAME  # the plain-QEMU guest: it only lists its PCI devices, and is quick under TCG


def run_plumbing(
    spec: str,
    release: str | None = None,
    accel: str = "auto",
    timeout: float = engine.DEFAULT_TIMEOUT,
    fetch: bool = False,
    force: bool = False,
    accept_reset_risk: bool = False,
) -> PlumbingRun:
    """`vm-test plumbing SPEC`: the device on vfio-pci, seen by a guest, given back. A verdict (mode plumbing),
    stored beside the console log, and what it saw of the device."""
    started_at = datetime.now(UTC)
    started = time.monotonic()
    if timeout <= 0:
        raise UsageError(f"invalid --timeout {timeout}", "give a number of seconds > 0")
    bdf = resolve_gpu(spec)
    require_root()
    pre = preflight(bdf, plumbing_only=True, force=force, accept_reset_risk=accept_reset_risk)
    release = user_input.kernel_release(release or os.uname().release)
    vm = guest_registry.find(GUEST)  # its programs are refused before binding, not after
    kernel = guest_kernel.locate(release, fetch=fetch)
    logs = log_dir() / "vm-test"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"{started_at:%Y%m%dT%H%M%SZ}-plumbing-{bdf.replace(':', '-')}"
    console = logs / f"{stem}.log"
    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-pt-") as tmp:
        rundir = Path(tmp)
        chosen = engine.choose_accel(accel, kernel, vm.qemu, rundir)
        request = GuestRequest(kernel, rundir, console, chosen.name, timeout, pre.devices)
        with bound(pre) as session:
            run = vm.boot(request)
            session.during = {d.bdf: vfio.current_driver(d.bdf) for d in pre.plan.passed}
    checks = judge(pre, session, run, timeout)
    guest = run.result
    outcome, reason = verdict.decide(checks)
    target_seen = _guest_counterparts(pre, guest).get(bdf)
    facts = PlumbingFacts(
        bdf=bdf,
        vendor_device=_id(pre.plan.target),
        guest_saw=target_seen["id"] if target_seen else None,
        iommu_group=pre.plan.iommu_group,
        group=pre.plan,
        devices=tuple(_device_story(d, session) for d in pre.plan.passed),
        reset=pre.reset,
        accepted_reset_risk=pre.accepted_reset_risk,
        forced=pre.forced,
    )
    record = verdict.Record(
        verdict=outcome,
        reason=reason,
        mode="plumbing",
        kernel=release,
        module=None,
        module_sha256=None,
        accel=chosen.name,
        checks=tuple(checks),
        selftest=None,
        console_log=str(console),
        seconds=round(time.monotonic() - started, 1),
        started=started_at.isoformat(timespec="seconds"),
        tool_version=__version__,
        details={"vm_seconds": round(run.outcome.elapsed, 1)},
        passthrough=facts.to_json(),
    )
    record = verdict.store(record, logs / f"{stem}.json")
    engine.say(f"verdict {record.verdict}: {record.reason} (record {record.record})")
    return PlumbingRun(record, facts)


def judge(pre: Preflight, session: Session, run: GuestRun, timeout: float) -> list[verdict.Check]:
    """The plumbing checks, in the order they happen."""
    checks = []
    guest = run.result

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append(verdict.Check(name, bool(ok), detail))

    bound_now = [b.bdf for b in session.bindings]
    check(
        "vfio-bind",
        len(bound_now) == len(pre.to_bind) and session.group_node is not None,
        f"{', '.join(d.bdf for d in pre.plan.passed)} on {vfio.VFIO_DRIVER}, "
        f"{session.group_node or '/dev/vfio/' + str(pre.plan.iommu_group) + ' missing'}",
    )
    if guest is None:
        tail = run.console_tail()
        why = (
            f"timed out after {timeout:.0f} s and was killed"
            if run.outcome.timed_out
            else f"the VM ended (exit {run.outcome.returncode}) without the guest's report"
        )
        if _NO_IRQ_REMAP in tail:
            why += (
                "; QEMU could not attach the group: this host has no interrupt remapping (enable it in the "
                "firmware, or load vfio_iommu_type1 with allow_unsafe_interrupts=1 at your own risk)"
            )
        check("guest-run", False, f"{why}; console tail: {tail}")
    else:
        check("guest-run", True, f"guest {guest['kernel']} listed {len(guest['devices'])} PCI devices")
    seen = _guest_counterparts(pre, guest)
    missing = [d for d in pre.plan.passed if d.bdf not in seen]
    if guest is None:
        check("guest-saw", False, "no report from the guest")
    elif missing:
        check("guest-saw", False, f"the guest has no {_id(missing[0])} behind the passthrough root port")
    else:
        check("guest-saw", True, ", ".join(f"{bdf} as {s['bdf']} ({s['id']})" for bdf, s in seen.items()))
    off = {bdf: drv for bdf, drv in session.during.items() if drv != vfio.VFIO_DRIVER}
    check(
        "vfio-during",
        bool(session.during) and not off,
        f"on {vfio.VFIO_DRIVER} when the guest ended"
        if session.during and not off
        else f"not on {vfio.VFIO_DRIVER} when the guest ended: {off or 'not reached'}",
    )
    back = [r for r in session.returned if not r.ok]
    check(
        "restored",
        not back and len(session.returned) == len(session.bindings),
        back[0].detail if back else "; ".join(r.detail for r in session.returned) or "nothing was bound",
    )
    if pre.accepted_reset_risk:
        risky = next(r for r in pre.reset if not r.ready)
        check("reset", True, f"risk accepted (--accept-reset-risk): {risky.detail}")
    else:
        check("reset", True, "; ".join(r.detail for r in pre.reset))
    return checks


def _guest_counterparts(pre: Preflight, guest: dict | None) -> dict[str, dict]:
    """Host bdf -> the guest device at the function it was given behind our root port, when the ids match."""
    if not guest:
        return {}
    devices = guest["devices"]
    ports = {d.bdf for d in devices if (d.vendor, d.device) == ROOT_PORT_IDS}
    behind = {d.bdf.rsplit(".", 1)[1]: d for d in devices if d.parent in ports}
    found = {}
    for fn, dev in enumerate(pre.plan.passed):
        cand = behind.get(str(fn))
        if cand and (cand.vendor, cand.device) == (f"0x{dev.vendor:04x}", f"0x{dev.device:04x}"):
            found[dev.bdf] = {"bdf": cand.bdf, "id": _id(dev)}
    return found


def _device_story(dev: sysfs.PciDevice, session: Session) -> DeviceStory:
    returned = next((r for r in session.returned if r.bdf == dev.bdf), None)
    return DeviceStory(
        bdf=dev.bdf,
        vendor_device=_id(dev),
        before=dev.driver,
        during=session.during.get(dev.bdf),
        after=returned.driver if returned else dev.driver,
        restored=returned.ok if returned else True,
    )
