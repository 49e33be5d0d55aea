"""The VM engine: boot a kernel in a guest of the host's own OS, run the guest checks, judge them, store the verdict.

The guest (guest.py) runs the host's own operating system: the emulated run in the host-root guest
(hostroot_guest.py: no init system, 6 s faster under TCG), a run with a device passed in the virtme-ng guest
(virtme_guest.py: udev makes the device's nodes). Everything else it needs
is mapped explicitly (vm/guest_view.py says why): a private run folder is shared read-write at /run/rdna1-kmgr,
where the host puts a copy of the module, the plan and the guest scripts and the guest writes result.json; the
Python installation and an unpacked kernel are mapped read-only. The verdict comes from result.json only.

Every QEMU run has a hard time limit and is killed with its whole session (core.runner). `--accel auto`
first boots the same kernel under KVM for a few seconds: KVM exists on some hosts but aborts or hangs a
real kernel (seen here), so only a kernel that gets through its whole init under KVM counts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rdna1_kmgr import __version__
from rdna1_kmgr.core import runner, user_input
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.core.paths import log_dir
from rdna1_kmgr.core.pipeline import Pipeline
from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.vm import gpu_checks, guest, guest_kernel, guest_registry, guest_view, qemu_args, verdict

ACCELS = ("auto", "kvm", "tcg")
DEFAULT_TIMEOUT = 300  # seconds for the guest run; an emulated verdict takes ~15 s under TCG
PROBE_TIMEOUT = 10.0  # a working KVM gets a kernel to its root mount in ~1 s
# The probe kernel has no root file system: reaching the panic about it means its whole init ran.
_PROBE_DONE = re.compile(r"VFS: Unable to mount root|Kernel panic - not syncing")

# collect.py needs the host's own OS in the guest (kmod, Python): both guests run it
EMULATED_GUEST = "host-root"
PASSTHROUGH_GUEST = "virtme-ng"
say = guest.say  # every line of a VM run, under its own prefix


# --- acceleration ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accel:
    name: str  # kvm or tcg
    why: str


def choose_accel(requested: str, kernel: guest_kernel.GuestKernel, qemu: str, workdir: Path) -> Accel:
    if requested not in ACCELS:
        raise UsageError(f"invalid --accel {requested!r}", f"use one of: {', '.join(ACCELS)}")
    if requested == "tcg":
        return Accel("tcg", "asked for")
    usable = os.access("/dev/kvm", os.R_OK | os.W_OK)
    if requested == "kvm":
        if not usable:
            raise HostError("/dev/kvm is missing or not accessible", "use --accel tcg, or load kvm and join group kvm")
        return Accel("kvm", "asked for")
    if not usable:
        return Accel("tcg", "no usable /dev/kvm")
    say(f"probing KVM (up to {PROBE_TIMEOUT:.0f} s)")
    works, why = probe_kvm(kernel, qemu, workdir)
    say(f"KVM {'works' if works else 'unusable'}: {why}")
    return Accel("kvm", why) if works else Accel("tcg", f"KVM probe failed: {why}")


def probe_kvm(
    kernel: guest_kernel.GuestKernel, qemu: str, workdir: Path, timeout: float = PROBE_TIMEOUT
) -> tuple[bool, str]:
    """Boot `kernel` under KVM, with the CPU the guests ask for, and see whether its init completes."""
    return kernel_init_completes(kernel, qemu, workdir, "kvm", qemu_args.KVM_CPU, timeout)


def kernel_init_completes(
    kernel: guest_kernel.GuestKernel, qemu: str, workdir: Path, accel: str, cpu: str, timeout: float
) -> tuple[bool, str]:
    """Boot `kernel` with no root file system: it works when it gets to the panic about the root mount."""
    argv = qemu_args.bare_console(
        qemu, f"accel={accel}", 256, kernel.image, "console=ttyS0 panic=-1 loglevel=4", cpu=cpu
    )
    seen = []

    def watch(chunk: str) -> bool:
        seen.append(chunk)
        return bool(_PROBE_DONE.search("".join(seen)[-4096:]))

    outcome = runner.run_session(argv, workdir / f"{accel}-probe.log", timeout, watch=watch)
    if outcome.stopped_early:
        return True, f"kernel init completed in {outcome.elapsed:.1f} s"
    if outcome.timed_out:
        return False, f"no progress within {timeout:.0f} s (the guest hangs)"
    last = guest.tail("".join(seen), 1) or "no output"
    return False, f"QEMU exited with code {outcome.returncode}: {last}"


# --- one guest run -----------------------------------------------------------------------------------------------


def workload_plan(name: str, view: guest_view.GuestView) -> dict:
    """How the guest runs a workload script: under rdna1-kmgr's own Python (its venv may hold torch), else
    the base interpreter, else the system's. Not with -I: torch lives in site-packages."""
    return {"name": name, "script": view.script(f"{name}.py"), "device": "cuda", "pythons": view.pythons()}


def guest_command(view: guest_view.GuestView, script: str = "collect.py") -> str:
    """The shell line the guest runs: our interpreter, our script and our run folder, as the guest
    sees them."""
    paths = [view.python, view.script(script), str(guest_view.GUEST_RUN)]
    for path in paths:
        if not path.startswith("/") or any(ch in path for ch in "\n\r\0"):
            raise HostError(f"unusable path for the guest: {path!r}", "install rdna1-kmgr under a plain path")
    # -I: nothing from the environment or user site; -S: no site module (its imports over 9p under
    # TCG cost ~2 s, and collect.py needs only the standard library).
    python, script, folder = paths
    return " ".join(shlex.quote(p) for p in (python, "-I", "-S", script, folder))


# --- the whole emulated validation ----------------------------------------------------------------------------


@dataclass
class VmTestContext:
    """What vm-test's stages read and fill: the module and its kernel, then the checks and what the guest said."""

    module: module_elf.ModuleFile
    module_path: Path  # as given (the record names it resolved)
    release: str
    kernel: guest_kernel.GuestKernel
    vm: guest.Guest
    accel: str
    timeout: float
    selftest_required: int | None
    devices: tuple[str, ...]
    gpu: gpu_checks.GpuTarget | None
    passthrough: dict[str, Any] | None  # the host's side of a passthrough run, for the record
    console: Path
    started_at: datetime
    started: float  # monotonic
    checks: list[verdict.Check] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    chosen: Accel | None = None
    result: dict[str, Any] | None = None  # what the guest's collect.py reported
    record: verdict.Record | None = None

    @property
    def fits(self) -> bool:
        return all(c.ok for c in self.checks)


class CheckFile:
    """The module file against the kernel: vermagic, its ELF, its signature's presence; no boot when it fails."""

    name = "check-file"

    def plan(self, ctx: VmTestContext) -> list[str]:
        return [f"check {ctx.module.path} against kernel {ctx.release} (vermagic {ctx.kernel.vermagic()})"]

    def run(self, ctx: VmTestContext) -> None:
        ctx.checks += verdict.check_module_file(ctx.module, ctx.release, ctx.kernel.vermagic())
        if not ctx.fits:
            say("the module does not fit the kernel: not booting")


class BootGuest:
    """The kernel booted with the guest loading a copy of the module (the bytes hashed are the bytes loaded)."""

    name = "boot"

    def plan(self, ctx: VmTestContext) -> list[str]:
        return [
            f"boot {ctx.release} in the {ctx.vm.name} guest ({ctx.accel}, {ctx.timeout:g} s), console {ctx.console}"
        ]

    def run(self, ctx: VmTestContext) -> None:
        if not ctx.fits:
            return
        with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-vm-") as tmp:
            rundir = Path(tmp)
            copy = rundir / ctx.module.path.name
            shutil.copyfile(ctx.module.path, copy)
            ctx.module = module_elf.read(copy, verdict.INIT_MESSAGES)
            workload_name = ctx.gpu.workload if ctx.gpu is not None else None
            view = guest_view.prepare(rundir, with_venv=bool(workload_name))
            workload = workload_plan(workload_name, view) if workload_name else None
            plan = verdict.guest_plan(ctx.module, view.guest_path(copy), gpu=ctx.gpu, workload=workload)
            (rundir / "plan.json").write_text(_json(plan))
            ctx.chosen = choose_accel(ctx.accel, ctx.kernel, ctx.vm.qemu, rundir)
            request = guest.GuestRequest(
                ctx.kernel, rundir, ctx.console, ctx.chosen.name, ctx.timeout, ctx.devices, guest_command(view), view
            )
            run = ctx.vm.boot(request)
            ctx.result = run.result
            problem = run.problem(ctx.timeout)
            ctx.checks += verdict.check_guest(
                ctx.result, ctx.module, ctx.release, ctx.selftest_required, problem, ctx.gpu
            )
            ctx.details.update(accel_why=ctx.chosen.why, stages=run.stages, vm_seconds=round(run.outcome.elapsed, 1))
            if ctx.result is not None:
                # The raw facts behind the verdict, kept beside the console log.
                raw = ctx.console.with_suffix(".result.json")
                raw.write_text(_json(ctx.result))
                ctx.details["guest_result"] = str(raw)


class RecordVerdict:
    """Every check decided into one verdict, stored as the record install's gate reads."""

    name = "verdict"

    def plan(self, ctx: VmTestContext) -> list[str]:
        return [f"record the verdict in {verdict.validations_dir()}"]

    def run(self, ctx: VmTestContext) -> None:
        outcome, reason = verdict.decide(ctx.checks)
        counts = verdict.selftest_counts(ctx.result)
        if counts is not None:
            counts["required"] = max(ctx.selftest_required or 1, 1)
        passthrough = ctx.passthrough
        if passthrough is not None:
            passthrough = {**passthrough, "workload": gpu_checks.workload_cases(ctx.result)}
        record = verdict.Record(
            verdict=outcome,
            reason=reason,
            mode="passthrough" if ctx.gpu is not None else "emulated",
            kernel=ctx.release,
            module=str(ctx.module_path.resolve()),
            module_sha256=ctx.module.sha256,
            accel=ctx.chosen.name if ctx.chosen else None,
            checks=tuple(ctx.checks),
            selftest=counts,
            console_log=str(ctx.console) if ctx.chosen else None,
            seconds=round(time.monotonic() - ctx.started, 1),
            started=ctx.started_at.isoformat(timespec="seconds"),
            tool_version=__version__,
            details=ctx.details,
            passthrough=passthrough,
        )
        ctx.record = verdict.store(record)
        say(f"verdict {outcome}: {reason} (record {ctx.record.record})")


VM_TEST: Pipeline[VmTestContext] = Pipeline((CheckFile(), BootGuest(), RecordVerdict()))


def validate_module(
    module_path: Path,
    release: str | None = None,
    accel: str = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    fetch: bool = False,
    selftest_required: int | None = None,
    devices: tuple[str, ...] = (),
    gpu: gpu_checks.GpuTarget | None = None,
    passthrough: dict | None = None,
) -> verdict.Record:
    """Validate a built amdgpu.ko in a VM of its kernel; store and return the verdict record.

    The kernel defaults to the one the module was built for (its vermagic). Bad input raises before
    anything is written; a module that fails any check gives a record with verdict "fail".
    With `gpu` it is a passthrough run: the caller has the GPU on vfio-pci and gives the PCI addresses the
    guest gets (`devices`), what the guest looks for (`gpu`) and the host's side for the record
    (`passthrough`). The run is VM_TEST's stages: the file checked, the guest booted, the verdict recorded.
    """
    started_at, started = datetime.now(UTC), time.monotonic()
    if timeout <= 0:
        raise UsageError(f"invalid --timeout {timeout}", "give a number of seconds > 0")
    module = module_elf.read(Path(module_path), verdict.INIT_MESSAGES)
    release = user_input.kernel_release(release or module.release)
    vm = guest_registry.find(PASSTHROUGH_GUEST if devices else EMULATED_GUEST)
    kernel = guest_kernel.locate(release, fetch=fetch)
    logs = log_dir() / "vm-test"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        verdict.validations_dir().mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise HostError(
            f"cannot write the console log or the verdict record: {err}",
            "run as root (they go to /var/log/rdna1-kmgr and /var/lib/rdna1-kmgr)",
        ) from None
    ctx = VmTestContext(
        module,
        Path(module_path),
        release,
        kernel,
        vm,
        accel,
        timeout,
        selftest_required,
        tuple(devices),
        gpu,
        passthrough,
        logs / f"{started_at:%Y%m%dT%H%M%SZ}-{module.sha256[:12]}.log",
        started_at,
        started,
        details={"build_id": module.build_id, "vermagic": module.vermagic, "kernel_origin": kernel.origin},
    )
    VM_TEST.run(ctx)
    assert ctx.record is not None  # the last stage stores it
    return ctx.record


def _json(obj) -> str:
    return json.dumps(obj, indent=1)
