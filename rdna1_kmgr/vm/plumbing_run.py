"""A plumbing-only run (`vm-test --gpu BDF --plumbing-only`): any PCI device handed to vfio-pci, seen by a
tiny guest, given back, and a verdict on that plumbing alone.

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
from rdna1_kmgr.core import runner, user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.files import write_json
from rdna1_kmgr.core.paths import log_dir
from rdna1_kmgr.host import sysfs
from rdna1_kmgr.vm import engine, guest_kernel, plumbing_guest, vfio
from rdna1_kmgr.vm.passthrough import (
    _NO_IRQ_REMAP,
    ROOT_PORT_IDS,
    Preflight,
    Session,
    _id,
    bound,
    preflight,
    qemu_devices,
    require_root,
    resolve_gpu,
)


def run_plumbing(
    spec: str,
    release: str | None = None,
    accel: str = "auto",
    timeout: float = engine.DEFAULT_TIMEOUT,
    fetch: bool = False,
    force: bool = False,
    accept_reset_risk: bool = False,
    report=engine.say,
) -> dict:
    """`vm-test --gpu SPEC --plumbing-only`: the device on vfio-pci, seen by a guest, given back. A verdict."""
    started_at = datetime.now(UTC)
    started = time.monotonic()
    if timeout <= 0:
        raise UsageError(f"invalid --timeout {timeout}", "give a number of seconds > 0")
    bdf = resolve_gpu(spec)
    require_root()
    pre = preflight(bdf, plumbing_only=True, force=force, accept_reset_risk=accept_reset_risk)
    release = user_input.kernel_release(release or os.uname().release)
    tools = engine.find_tools()
    kernel = guest_kernel.locate(release, fetch=fetch)
    plumbing_guest.static_busybox()  # refuse before binding, not after
    logs = log_dir() / "vm-test"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"{started_at:%Y%m%dT%H%M%SZ}-plumbing-{bdf.replace(':', '-')}"
    console = logs / f"{stem}.log"
    guest = None
    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-pt-") as tmp:
        rundir = Path(tmp)
        initramfs = plumbing_guest.build_initramfs(rundir / "initramfs.cpio")
        chosen = engine.choose_accel(accel, kernel, tools, rundir, report)
        argv = plumbing_guest.qemu_argv(
            tools.qemu, kernel.image, initramfs, chosen.name, qemu_devices(pre), engine.KVM_CPU
        )
        with bound(pre, report) as session:
            report(
                f"booting {release} with {' '.join(d.bdf for d in pre.plan.passed)} "
                f"({chosen.name}, hard limit {timeout:.0f} s), console log {console}"
            )
            outcome = runner.run_session(argv, console, timeout, cwd="/")
            guest = plumbing_guest.parse_console(console.read_text(errors="replace"))
            session.during = {d.bdf: vfio.current_driver(d.bdf) for d in pre.plan.passed}
    checks = judge(pre, session, guest, outcome, timeout, console)
    failed = [c for c in checks if not c["ok"]]
    target_seen = _guest_counterparts(pre, guest).get(bdf)
    result = {
        "verdict": "fail" if failed else "pass",
        "reason": f"{failed[0]['name']}: {failed[0]['detail']}" if failed else "all checks passed",
        "mode": "passthrough",
        "plumbing_only": True,
        "device": bdf,
        "vendor_device": _id(pre.plan.target),
        "guest_saw": target_seen["id"] if target_seen else None,
        "kernel": release,
        "accel": chosen.name,
        "iommu_group": pre.plan.iommu_group,
        "group": pre.plan.to_json(),
        "devices": [_device_story(d, session) for d in pre.plan.passed],
        "checks": checks,
        "reset": [r.to_json() for r in pre.reset],
        "accepted_reset_risk": pre.accepted_reset_risk,
        "forced": list(pre.forced),
        "console_log": str(console),
        "vm_seconds": round(outcome.elapsed, 1),
        "seconds": round(time.monotonic() - started, 1),
        "started": started_at.isoformat(timespec="seconds"),
        "tool_version": __version__,
    }
    record = logs / f"{stem}.json"
    result["record"] = str(record)
    write_json(record, result, indent=2, sort_keys=True)
    report(f"verdict {result['verdict']}: {result['reason']} (record {record})")
    return result


def judge(
    pre: Preflight, session: Session, guest: dict | None, outcome: runner.Outcome, timeout: float, console: Path
) -> list[dict]:
    """The plumbing checks, in the order they happen."""
    checks = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    bound_now = [b.bdf for b in session.bindings]
    check(
        "vfio-bind",
        len(bound_now) == len(pre.to_bind) and session.group_node is not None,
        f"{', '.join(d.bdf for d in pre.plan.passed)} on {vfio.VFIO_DRIVER}, "
        f"{session.group_node or '/dev/vfio/' + str(pre.plan.iommu_group) + ' missing'}",
    )
    if guest is None:
        tail = _tail(console)
        why = (
            f"timed out after {timeout:.0f} s and was killed"
            if outcome.timed_out
            else f"the VM ended (exit {outcome.returncode}) without the guest's report"
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
    back = [r for r in session.returned if not r["ok"]]
    check(
        "restored",
        not back and len(session.returned) == len(session.bindings),
        back[0]["detail"] if back else "; ".join(r["detail"] for r in session.returned) or "nothing was bound",
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


def _device_story(dev: sysfs.PciDevice, session: Session) -> dict:
    returned = next((r for r in session.returned if r["bdf"] == dev.bdf), None)
    return {
        "bdf": dev.bdf,
        "vendor_device": _id(dev),
        "before": dev.driver,
        "during": session.during.get(dev.bdf),
        "after": returned["driver"] if returned else dev.driver,
        "restored": returned["ok"] if returned else True,
    }


def _tail(console: Path, lines: int = 6) -> str:
    try:
        text = console.read_text(errors="replace")
    except OSError:
        return "(no console log)"
    kept = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "(empty)"
