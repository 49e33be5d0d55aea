"""A passthrough run: check the host, hand the device's group to vfio-pci, boot a guest with it, give it back.

The order matters for a real desktop. Every refusal happens before anything changes (IOMMU and group,
display, reset readiness, vfio-pci). Each device is journaled (vfio_journal) before it is unbound, and
given back in a `finally` with SIGINT/SIGTERM/SIGHUP held off, so success, failure, a hard timeout and
Ctrl-C all end with the devices on their own drivers; SIGKILL leaves the journal for `vm-test restore`.

In the guest the devices sit behind a PCIe root port QEMU adds (a GPU expects to be on PCIe), function for
function (qemu_args.vfio_devices); a run hands the guest their addresses (guest.GuestRequest.devices).

`vm-test plumbing` (plumbing_run.py) passes any device and checks only that plumbing. A returned amdgpu
board is checked to have really come back.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import Exit, HostError, KmgrError, UsageError
from rdna1_kmgr.host import host_facts, kmsg, sysfs
from rdna1_kmgr.host.rdna1_boards import DEFAULT_TARGET, format_id, is_rdna1
from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.vm import engine, gpu_checks, guest_kernel, reset_readiness, verdict, vfio, vfio_journal

AMDGPU = "amdgpu"
# What a board that did not come back leaves in the host's log (probe errors, a failed IP block init, ...).
_PROBE_TROUBLE = re.compile(r"\bfail(ed|ure)?\b|\berror\b|\bfatal\b|\btimed? ?out\b", re.IGNORECASE)
# QEMU's words when the host has no interrupt remapping and vfio_iommu_type1 does not allow that.
_NO_IRQ_REMAP = "Failed to set iommu for container: Operation not permitted"
_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class Interrupted(KmgrError):
    """A signal stopped the run; the devices were given back first."""

    exit_code = Exit.INTERRUPTED


@dataclass(frozen=True)
class Preflight:
    plan: vfio.GroupPlan
    reset: tuple[reset_readiness.Readiness, ...]
    accepted_reset_risk: bool  # a device with the reset bug goes to the VM anyway
    forced: tuple[str, ...]  # display use --force went past
    to_bind: tuple[sysfs.PciDevice, ...]  # the passed devices not on vfio-pci already

    @property
    def devices(self) -> tuple[str, ...]:
        """The PCI addresses the guest gets: the target and its slot's functions, the target first."""
        return tuple(d.bdf for d in self.plan.passed)


@dataclass
class Session:
    """What happened to the devices: the bindings made, the drivers seen, what came back."""

    run: str
    bindings: list[vfio_journal.Binding] = field(default_factory=list)
    group_node: str | None = None
    during: dict[str, str | None] = field(default_factory=dict)  # driver of each device when the guest ended
    returned: list[vfio.Returned] = field(default_factory=list)


# --- before anything changes ---------------------------------------------------------------------------------


def require_root() -> None:
    if os.geteuid() != 0:
        raise HostError("passing a device to a VM and giving it back needs root (sysfs writes, vfio)", "run it as root")


def resolve_gpu(spec: str, sysroot: Path = Path("/")) -> str:
    """`auto` is the target board detect finds; anything else must be a PCI address."""
    if spec != "auto":
        return user_input.pci_address(spec)
    target = host_facts.detect(sysroot).target
    if target is None:
        raise HostError(
            f"no {format_id(DEFAULT_TARGET)} (RX 5600 XT) board found on this host",
            "give the board's address DDDD:BB:DD.F instead of auto (see `rdna1-kmgr detect`)",
        )
    return target.bdf


def require_rdna1(bdf: str, sysroot: Path = Path("/")) -> None:
    """The GPU modes (the module test, the matrix) need an RDNA1 board at `bdf`: refused first, before a missing
    build or anything else could hide that the board is the wrong one."""
    dev = sysfs.read_device(user_input.pci_address(bdf), sysroot)
    if not is_rdna1(dev.vendor, dev.device):
        raise UsageError(
            f"{bdf} ({dev.vendor:04x}:{dev.device:04x}) is not an RDNA1 GPU",
            "the GPU test needs one; `vm-test plumbing BDF` tests only the VFIO plumbing with it",
        )


def preflight(
    bdf: str, plumbing_only: bool, force: bool = False, accept_reset_risk: bool = False, sysroot: Path = Path("/")
) -> Preflight:
    """Every refusal, in one-line errors, before anything is changed."""
    if not plumbing_only:
        require_rdna1(bdf, sysroot)
    plan = vfio.plan_group(bdf, sysroot)
    forced = vfio.refuse_display(plan, force, sysroot)
    _refuse_journaled(plan)
    reset = reset_readiness.require(list(plan.passed), accept_reset_risk, sysroot)
    vfio.ensure_vfio_pci(sysroot)
    return Preflight(
        plan=plan,
        reset=tuple(reset),
        accepted_reset_risk=any(not r.ready for r in reset),
        forced=tuple(forced),
        to_bind=tuple(d for d in plan.passed if d.driver != vfio.VFIO_DRIVER),
    )


def _refuse_journaled(plan: vfio.GroupPlan) -> None:
    journaled = {b.bdf: b for b in vfio_journal.pending()}
    for dev in plan.passed:
        if dev.bdf in journaled:
            b = journaled[dev.bdf]
            if vfio_journal.owner_alive(b):
                raise HostError(
                    f"{dev.bdf} is passed through by another rdna1-kmgr run (pid {b.pid})", "wait for it to end"
                )
            raise HostError(
                f"{dev.bdf} was left on vfio-pci by an earlier run that did not finish (pid {b.pid})",
                "give it back first: rdna1-kmgr vm-test restore",
            )


# --- bind, and always give back ---------------------------------------------------------------------------


@contextmanager
def bound(pre: Preflight) -> Iterator[Session]:
    """Devices on vfio-pci for the body of the `with`; given back however the body ends.

    The run's token goes into this process's environment for as long as the devices are bound, so every
    program started meanwhile (vng, QEMU) carries it and `--restore` can find them after a SIGKILL.
    """
    require_root()
    session = Session(run=uuid.uuid4().hex)
    pid, start, boot = vfio_journal.me()
    seq = kmsg.last_seq()
    os.environ[vfio_journal.RUN_ENV] = session.run
    _raise_memlock()
    with _signals_raise():
        try:
            for dev in pre.to_bind:
                binding = vfio_journal.Binding(
                    bdf=dev.bdf,
                    vendor=dev.vendor,
                    device=dev.device,
                    driver=dev.driver,
                    driver_override=sysfs.driver_override(dev.bdf),
                    iommu_group=pre.plan.iommu_group,
                    run=session.run,
                    pid=pid,
                    pid_start=start,
                    boot_id=boot,
                    kmsg_seq=seq,
                    started=datetime.now(UTC).isoformat(timespec="seconds"),
                )
                vfio_journal.write(binding)  # before the first write to the device
                session.bindings.append(binding)
                engine.say(f"{dev.bdf}: {dev.driver or 'no driver'} -> {vfio.VFIO_DRIVER}")
                vfio.bind(dev)
            node = vfio.group_node(pre.plan.iommu_group)
            session.group_node = str(node) if node else None
            yield session
        finally:
            os.environ.pop(vfio_journal.RUN_ENV, None)
            # Held, not ignored: a signal that comes now is raised once every device is back.
            with _signals_held():
                session.returned = give_back_all(session.bindings)


def give_back_all(bindings: list[vfio_journal.Binding]) -> list[vfio.Returned]:
    """Give each device back (last bound first), check GPUs came back, drop the records of those done."""
    results = []
    for binding in reversed(bindings):
        returned = vfio.give_back(binding)
        entry = returned
        if binding.driver == AMDGPU and returned.driver == AMDGPU:
            back = vfio.CameBack(*came_back(binding))
            entry = dataclasses.replace(returned, came_back=back)
            if not back.ok:
                entry = dataclasses.replace(entry, ok=False, detail=back.detail)
        engine.say(entry.detail)
        if returned.ok or not _still_ours(binding):
            vfio_journal.forget(binding.bdf)
        results.append(entry)
    return list(reversed(results))


def came_back(binding: vfio_journal.Binding, sysroot: Path = Path("/")) -> tuple[bool, str]:
    """A GPU given back to amdgpu works again: driver bound, DRM card made, no probe error logged since the bind."""
    bdf = binding.bdf
    power_cycle = "the board needs a power cycle: shut the machine down, switch it off at the wall, then boot"
    if vfio.current_driver(bdf, sysroot) != AMDGPU:
        return False, f"{bdf} did not come back on amdgpu: {power_cycle}"
    trouble = [
        r.message
        for r in kmsg.since(binding.kmsg_seq, sysroot)
        if bdf in r.message and _PROBE_TROUBLE.search(r.message)
    ]
    cards = [n for n in sysfs.drm_nodes(bdf, sysroot) if n.startswith("card")]
    if not cards:
        said = f" (kernel: {trouble[0]})" if trouble else ""
        return False, f"{bdf} is bound to amdgpu but has no DRM card{said}: {power_cycle}"
    if trouble:
        return False, f"{bdf} came back on amdgpu as {cards[0]} but the kernel logged: {trouble[0]}: {power_cycle}"
    return True, f"{bdf} came back on amdgpu as /dev/dri/{cards[0]}, no errors logged since the bind"


def _still_ours(binding: vfio_journal.Binding) -> bool:
    """Whether anything of the bind is left on the device (so `--restore` has something to retry)."""
    path = sysfs.devices_dir() / binding.bdf
    return path.is_dir() and (
        vfio.current_driver(binding.bdf) == vfio.VFIO_DRIVER or sysfs.driver_override(binding.bdf) == vfio.VFIO_DRIVER
    )


# --- after a SIGKILL: vm-test restore, rollback ----------------------------------------------------------


def restore_pending() -> tuple[vfio.Returned, ...]:
    """Give back every device a run left on vfio-pci. Runs still going keep theirs.

    A killed run's VM may still be running and holding the group; it is stopped first (found by the run
    token in its environment). A group some other program holds is left alone: unbinding it would hang.
    """
    pending = vfio_journal.pending()
    if pending:
        require_root()
    results: list[vfio.Returned] = []
    waiting = []
    for binding in pending:
        if vfio_journal.owner_alive(binding):
            left = f"{binding.bdf} belongs to a running rdna1-kmgr (pid {binding.pid}): left"
            results.append(vfio.Returned(binding.bdf, binding.driver, None, False, left))
        else:
            waiting.append(binding)
    for run in sorted({b.run for b in waiting}):
        for pid, name in stop_run_processes(run):
            engine.say(f"stopped {name} (pid {pid}) left running by the killed run")
    for binding in waiting:
        users = vfio.holders(f"/dev/vfio/{binding.iommu_group}")
        if users:
            pid, name = users[0]
            held = (
                f"IOMMU group {binding.iommu_group} of {binding.bdf} is open in {name} "
                f"(pid {pid}): stop it, then run `rdna1-kmgr vm-test restore` again"
            )
            results.append(vfio.Returned(binding.bdf, binding.driver, vfio.current_driver(binding.bdf), False, held))
            continue
        results += give_back_all([binding])
    return tuple(sorted(results, key=lambda r: r.bdf))


def stop_run_processes(run: str, grace: float = 3.0, wait: float = 10.0) -> list[tuple[int, str]]:
    """SIGTERM, then SIGKILL, every process whose environment carries the run's token; wait until gone."""
    marker = f"{vfio_journal.RUN_ENV}={run}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append((int(entry.name), (entry / "comm").read_text().strip()))
        except OSError:
            continue
    for sig, limit in ((signal.SIGTERM, grace), (signal.SIGKILL, wait)):
        left = [pid for pid, _ in found if _alive(pid)]
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + limit
        while any(_alive(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.1)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# --- the GPU run ------------------------------------------------------------------------------------------


def run_gpu(
    spec: str,
    module_path: Path,
    quirks: list[str] | None,
    release: str | None = None,
    accel: str = "auto",
    timeout: float = engine.DEFAULT_TIMEOUT,
    fetch: bool = False,
    force: bool = False,
    accept_reset_risk: bool = False,
    workload: str = "smoke",
    selftest_required: int | None = None,
) -> verdict.Record:
    """`vm-test gpu SPEC`: every emulated check, in a guest that drives the GPU, plus the GPU's own.

    preflight (every refusal) -> devices on vfio-pci -> engine.validate_module in passthrough mode -> devices
    given back -> whether they came back goes into the record (a board that did not is a failed verdict:
    the host is not in the state the test found it in). `quirks`: the ids the render made (the manifest).
    """
    if timeout <= 0:
        raise UsageError(f"invalid --timeout {timeout}", "give a number of seconds > 0")
    bdf = resolve_gpu(spec)
    require_root()
    pre = preflight(bdf, plumbing_only=False, force=force, accept_reset_risk=accept_reset_risk)
    release = user_input.kernel_release(release or module_elf.read(Path(module_path), verdict.INIT_MESSAGES).release)
    guest_kernel.locate(release, fetch=fetch)  # a missing kernel is refused (or fetched) before anything is bound
    gpu = gpu_checks.GpuTarget(
        _id(pre.plan.target), tuple(quirks) if quirks is not None else None, workload if workload != "smoke" else None
    )
    story = {
        "bdf": bdf,
        "vendor_device": gpu.vendor_device,
        "iommu_group": pre.plan.iommu_group,
        "passed": [d.bdf for d in pre.plan.passed],
        "accepted_reset_risk": pre.accepted_reset_risk,
        "forced": list(pre.forced),
        "reset": [r.to_json() for r in pre.reset],
    }
    with bound(pre) as session:
        record = engine.validate_module(
            module_path,
            release,
            accel=accel,
            timeout=timeout,
            fetch=fetch,
            selftest_required=selftest_required,
            devices=pre.devices,
            gpu=gpu,
            passthrough=story,
        )
        session.during = {d.bdf: vfio.current_driver(d.bdf) for d in pre.plan.passed}
    return settle(record, session)


def settle(record: verdict.Record, session: Session) -> verdict.Record:
    """Add what happened to the devices after the guest to the record, judge again, store it."""
    back = [r for r in session.returned if not r.ok]
    complete = len(session.returned) == len(session.bindings)
    checks = (
        *record.checks,
        verdict.Check(
            "restored",
            not back and complete,
            back[0].detail if back else "; ".join(r.detail for r in session.returned) or "nothing was bound",
        ),
    )
    outcome, reason = verdict.decide(list(checks))
    devices = [r.to_json() for r in session.returned]
    story = {**(record.passthrough or {}), "during": session.during, "devices": devices}
    story["came_back"] = not back and complete
    return verdict.store(dataclasses.replace(record, checks=checks, verdict=outcome, reason=reason, passthrough=story))


# --- helpers -------------------------------------------------------------------------------------------------


def _id(dev: sysfs.PciDevice) -> str:
    return f"{dev.vendor:04x}:{dev.device:04x}"


def _raise_memlock() -> None:
    """vfio pins all guest memory; lift this process's locked-memory limit (root may) for the VM it starts."""
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted (SIGINT already raises KeyboardInterrupt), so `finally` runs."""

    def handler(signum, frame):
        raise Interrupted(f"stopped by {signal.Signals(signum).name}; the devices were given back")

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@contextmanager
def _signals_held() -> Iterator[None]:
    """No signal cuts a restore short; one that arrives meanwhile is delivered after it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
