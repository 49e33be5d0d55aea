"""The VM engine: boot a kernel under virtme-ng, run the guest checks, judge them, store the verdict.

virtme-ng boots the kernel with the host's root file system read-only over 9p, so the guest runs the
host's own operating system (shell, kmod). Everything else the guest needs is mapped explicitly
(vm/guest_view.py says why): a private run folder is shared read-write at /run/rdna1-kmgr, where the
host puts a copy of the module, the plan and the guest scripts and the guest writes result.json; the
Python installation and an unpacked kernel are mapped read-only. vng's exit code says nothing (it is
255 even when the guest script succeeds); the verdict comes from result.json only.

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
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rdna1_kmgr import __version__
from rdna1_kmgr.core import progress, runner, user_input
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.core.paths import log_dir
from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.vm import guest_kernel, guest_view, qemu_args, verdict

ACCELS = ("auto", "kvm", "tcg")
DEFAULT_TIMEOUT = 300  # seconds for the guest run; an emulated verdict takes ~20-30 s under TCG
PROBE_TIMEOUT = 10.0  # a working KVM gets a kernel to its root mount in ~1 s
GUEST_MEMORY = "2G"  # an unstripped amdgpu.ko is ~350 MB and is read whole by the kernel
# Loading a module is single-threaded; a second vCPU only made TCG boots ~3 s slower on a 2-core host.
GUEST_CPUS = "1"
KVM_CPU = "host,topoext=on"  # what vng asks for under KVM: the probe must use the same
# udev in the guest autoloads drivers for the emulated q35 machine (AHCI, ICH9, watchdogs, input) and
# the CPU's crypto accelerators, and nested KVM: none is needed to test amdgpu, and under TCG they made
# "udev settle" take 19 s instead of 6 s here (cpufreq drivers probe in vain under TCG too). modprobe.blacklist=
# stops alias loads only, so an
# explicit `modprobe dep` of amdgpu's dependencies (none of these) still works.
GUEST_BLACKLIST = (
    "kvm",
    "kvm_amd",
    "kvm_intel",
    "powernow_k8",
    "acpi_cpufreq",
    "ahci",
    "lpc_ich",
    "i2c_i801",
    "i6300esb",
    "iTCO_wdt",
    "intel_pmc_bxt",
    "psmouse",
    "serio_raw",
    "pcspkr",
    "evdev",
    "qemu_fw_cfg",
    "aesni_intel",
    "ghash_clmulni_intel",
    "sha1_ssse3",
    "sha256_ssse3",
    "sha512_ssse3",
    "crc32_pclmul",
    "crc32c_intel",
    "crct10dif_pclmul",
)

# Console lines that mark boot stages, for progress and for the record's timings.
_STAGES = (
    (re.compile(r"Linux version \S+"), "kernel started"),
    (re.compile(r"virtme initramfs: mounting hostfs"), "initramfs mounts the host's root"),
    (re.compile(r"virtme-ng-init: basic initialization done"), "guest init done"),
    (re.compile(r"rdna1-kmgr: stage (.+)"), None),  # collect.py's own steps
    (re.compile(r"reboot: Power down"), "guest powered off"),
)
# The probe kernel has no root file system: reaching the panic about it means its whole init ran.
_PROBE_DONE = re.compile(r"VFS: Unable to mount root|Kernel panic - not syncing")

Reporter = Callable[[str], None]


def say(line: str) -> None:
    progress.say(f"vm-test: {line}")


# --- tools -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    vng: str
    qemu: str

    def env(self) -> dict[str, str]:
        # vng runs virtme-run through PATH: the folder vng lives in (a venv's bin) must be on it.
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(Path(self.vng).parent), env.get("PATH", "/usr/bin:/bin")])
        return env


def find_tools() -> Tools:
    beside = Path(sys.executable).parent / "vng"
    vng = str(beside) if beside.is_file() else shutil.which("vng")
    if vng is None:
        raise HostError("virtme-ng (vng) is not installed", "pip install virtme-ng (into rdna1-kmgr's environment)")
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise HostError("qemu-system-x86_64 is not installed", "apt-get install qemu-system-x86")
    if shutil.which("busybox") is None:
        # virtme-ng builds an initramfs with busybox for distro kernels (their 9p and virtio are modules).
        raise HostError("busybox is not installed", "apt-get install busybox-static")
    return Tools(vng, qemu)


# --- acceleration ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accel:
    name: str  # kvm or tcg
    why: str


def choose_accel(
    requested: str, kernel: guest_kernel.GuestKernel, tools: Tools, workdir: Path, report: Reporter = say
) -> Accel:
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
    report(f"probing KVM (up to {PROBE_TIMEOUT:.0f} s)")
    works, why = probe_kvm(kernel, tools, workdir)
    report(f"KVM {'works' if works else 'unusable'}: {why}")
    return Accel("kvm", why) if works else Accel("tcg", f"KVM probe failed: {why}")


def probe_kvm(
    kernel: guest_kernel.GuestKernel, tools: Tools, workdir: Path, timeout: float = PROBE_TIMEOUT
) -> tuple[bool, str]:
    """Boot `kernel` under KVM, with the CPU vng would ask for, and see whether its init completes."""
    return kernel_init_completes(kernel, tools, workdir, "kvm", KVM_CPU, timeout)


def kernel_init_completes(
    kernel: guest_kernel.GuestKernel, tools: Tools, workdir: Path, accel: str, cpu: str, timeout: float
) -> tuple[bool, str]:
    """Boot `kernel` with no root file system: it works when it gets to the panic about the root mount."""
    argv = qemu_args.bare_console(
        tools.qemu, f"accel={accel}", 256, kernel.image, "console=ttyS0 panic=-1 loglevel=4", cpu=cpu
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
    last = _tail("".join(seen), 1) or "no output"
    return False, f"QEMU exited with code {outcome.returncode}: {last}"


# --- one guest run -----------------------------------------------------------------------------------------------


class StageWatcher:
    """Follows the console as it grows; reports each boot stage once, with the time since the start."""

    def __init__(self, report: Reporter, clock=time.monotonic):
        self.report = report
        self.clock = clock
        self.started = clock()
        self.stages: list[tuple[float, str]] = []
        self._partial = ""

    def feed(self, chunk: str) -> bool:
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        return False  # never stops the run

    def _line(self, line: str) -> None:
        for pattern, name in _STAGES:
            match = pattern.search(line)
            if match:
                stage = name or match.group(1).strip()
                if all(stage != seen for _, seen in self.stages):
                    elapsed = self.clock() - self.started
                    self.stages.append((round(elapsed, 1), stage))
                    self.report(f"{elapsed:5.1f} s  {stage}")
                return


@dataclass
class GuestRun:
    outcome: runner.Outcome
    console: Path
    result: dict | None
    stages: list[tuple[float, str]]

    def problem(self, timeout: float) -> str | None:
        """Why the run did not end well, with the end of the console, or None."""
        if self.outcome.timed_out:
            return f"timed out after {timeout:.0f} s and was killed; console tail: {self.console_tail()}"
        if self.result is None:
            return (
                f"the VM ended (exit {self.outcome.returncode}) without a result; console tail: {self.console_tail()}"
            )
        if not self.result.get("finished"):
            return f"the guest stopped before finishing; console tail: {self.console_tail()}"
        return None

    def console_tail(self, lines: int = 6) -> str:
        try:
            return _tail(self.console.read_text(errors="replace"), lines) or "(empty)"
        except OSError:
            return "(no console log)"


def vng_argv(
    tools: Tools,
    kernel: guest_kernel.GuestKernel,
    view: guest_view.GuestView,
    accel: Accel,
    guest_command: str,
    extra: list[str] | tuple[str, ...] = (),
    blacklist: tuple[str, ...] = GUEST_BLACKLIST,
) -> list[str]:
    argv = [
        tools.vng,
        "--run",
        str(kernel.image),
        "--user",
        "root",  # insmod needs it, whoever runs the host side
        "--cwd",
        "/",
        "--memory",
        GUEST_MEMORY,
        "--cpus",
        GUEST_CPUS,
        "--verbose",  # the kernel console goes to our log: progress, and the tail on failure
        "--qemu",
        tools.qemu,
        # virtiofsd is tried first otherwise; where it cannot start, vng waits ~5 s before using 9p.
        "--force-9p",
        *view.vng_args(),  # the run folder, and whatever else the guest must see (guest_view)
        "--append",
        "modprobe.blacklist=" + ",".join(blacklist),
    ]
    if accel.name == "tcg":
        argv.append("--disable-kvm")
    # extra: a passthrough run's devices and machine (passthrough.vng_passthrough_args)
    return argv + list(extra) + ["--exec", guest_command]


def workload_plan(name: str, view: guest_view.GuestView) -> dict:
    """How the guest runs a workload script: under rdna1-kmgr's own Python (its venv may hold torch), else
    the base interpreter, else the system's. Not with -I: torch lives in site-packages."""
    return {"name": name, "script": view.script(f"{name}.py"), "device": "cuda", "pythons": view.pythons()}


def guest_command(view: guest_view.GuestView, script: str = "collect.py") -> str:
    """The shell line vng runs in the guest: our interpreter, our script and our run folder, as the guest
    sees them."""
    paths = [view.python, view.script(script), str(guest_view.GUEST_RUN)]
    for path in paths:
        if not path.startswith("/") or any(ch in path for ch in "\n\r\0"):
            raise HostError(f"unusable path for the guest: {path!r}", "install rdna1-kmgr under a plain path")
    # -I: nothing from the environment or user site; -S: no site module (its imports over 9p under
    # TCG cost ~2 s, and collect.py needs only the standard library).
    python, script, folder = paths
    return " ".join(shlex.quote(p) for p in (python, "-I", "-S", script, folder))


def boot(
    tools: Tools,
    kernel: guest_kernel.GuestKernel,
    view: guest_view.GuestView,
    accel: Accel,
    timeout: float,
    console: Path,
    report: Reporter = say,
    extra_vng_args: list[str] | tuple[str, ...] = (),
    mode: str = "emulated",
    script: str = "collect.py",
) -> GuestRun:
    """Boot the kernel, run the guest script (collect.py, or the experiment's matrix.py) on the run
    folder's plan.json, and return what came back."""
    watcher = StageWatcher(report)
    report(f"booting {kernel.release} ({accel.name}, hard limit {timeout:.0f} s), console log {console}")
    # With a GPU passed, udev would autoload the distro's own amdgpu for it before the test loads ours.
    blacklist = GUEST_BLACKLIST + (("amdgpu",) if mode == "passthrough" else ())
    outcome = runner.run_session(
        vng_argv(tools, kernel, view, accel, guest_command(view, script), extra_vng_args, blacklist),
        console,
        timeout,
        env=tools.env(),
        cwd="/",
        watch=watcher.feed,
    )
    return GuestRun(outcome, console, _read_result(view.run / "result.json"), watcher.stages)


def _read_result(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --- the whole emulated validation ----------------------------------------------------------------------------


def validate_module(
    module_path: Path,
    release: str | None = None,
    accel: str = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    fetch: bool = False,
    selftest_required: int | None = None,
    report: Reporter = say,
    extra_vng_args: list[str] | tuple[str, ...] = (),
    gpu: verdict.GpuTarget | None = None,
    passthrough: dict | None = None,
) -> verdict.Record:
    """Validate a built amdgpu.ko in a VM of its kernel; store and return the verdict record.

    The kernel defaults to the one the module was built for (its vermagic). Bad input raises before
    anything is written; a module that fails any check gives a record with verdict "fail".
    With `gpu` it is a passthrough run: the caller has the GPU on vfio-pci and gives the vng arguments that
    pass it (`extra_vng_args`), what the guest looks for (`gpu`) and the host's side for the record
    (`passthrough`).
    """
    mode = "passthrough" if gpu is not None else "emulated"
    started_at = datetime.now(UTC)
    started = time.monotonic()
    if timeout <= 0:
        raise UsageError(f"invalid --timeout {timeout}", "give a number of seconds > 0")
    module = module_elf.read(Path(module_path), verdict.INIT_MESSAGES)
    release = user_input.kernel_release(release or module.release)
    tools = find_tools()
    kernel = guest_kernel.locate(release, fetch=fetch)
    checks = verdict.check_module_file(module, release, kernel.vermagic())
    logs = log_dir() / "vm-test"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        verdict.validations_dir().mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise HostError(
            f"cannot write the console log or the verdict record: {err}",
            "run as root (they go to /var/log/rdna1-kmgr and /var/lib/rdna1-kmgr)",
        ) from None
    console = logs / f"{started_at:%Y%m%dT%H%M%SZ}-{module.sha256[:12]}.log"
    details: dict = {"build_id": module.build_id, "vermagic": module.vermagic, "kernel_origin": kernel.origin}
    chosen = None
    result = None
    if all(c.ok for c in checks):
        with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-vm-") as tmp:
            rundir = Path(tmp)
            # The guest loads a copy in the run folder: the bytes hashed are the bytes loaded.
            copy = rundir / module.path.name
            shutil.copyfile(module.path, copy)
            module = module_elf.read(copy, verdict.INIT_MESSAGES)
            wants_workload = bool(gpu and gpu.workload)
            view = guest_view.prepare(
                rundir, kernel.root if kernel.origin == "cache" else None, with_venv=wants_workload
            )
            workload = workload_plan(gpu.workload, view) if wants_workload else None
            plan = verdict.guest_plan(module, view.guest_path(copy), gpu=gpu, workload=workload)
            (rundir / "plan.json").write_text(_json(plan))
            chosen = choose_accel(accel, kernel, tools, rundir, report)
            run = boot(tools, kernel, view, chosen, timeout, console, report, extra_vng_args, mode)
            result = run.result
            checks += verdict.check_guest(result, module, release, selftest_required, run.problem(timeout), gpu)
            details.update(accel_why=chosen.why, stages=run.stages, vm_seconds=round(run.outcome.elapsed, 1))
            if result is not None:
                # The raw facts behind the verdict, kept beside the console log.
                raw = console.with_suffix(".result.json")
                raw.write_text(_json(result))
                details["guest_result"] = str(raw)
    else:
        console = None
        report("the module does not fit the kernel: not booting")
    outcome, reason = verdict.decide(checks)
    counts = verdict.selftest_counts(result)
    if counts is not None:
        counts["required"] = max(selftest_required or 1, 1)
    if passthrough is not None:
        passthrough = {**passthrough, "workload": verdict.workload_cases(result)}
    record = verdict.Record(
        verdict=outcome,
        reason=reason,
        mode=mode,
        kernel=release,
        module=str(Path(module_path).resolve()),
        module_sha256=module.sha256,
        accel=chosen.name if chosen else None,
        checks=checks,
        selftest=counts,
        console_log=str(console) if console else None,
        seconds=round(time.monotonic() - started, 1),
        started=started_at.isoformat(timespec="seconds"),
        tool_version=__version__,
        details=details,
        passthrough=passthrough,
    )
    verdict.write(record)
    report(f"verdict {outcome}: {reason} (record {record.record})")
    return record


def _json(obj) -> str:
    return json.dumps(obj, indent=1)


def _tail(text: str, lines: int) -> str:
    kept = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])
