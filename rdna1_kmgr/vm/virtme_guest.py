"""The virtme-ng guest: the kernel booted with the host's root file system read-only over 9p, so the guest runs
the host's own operating system (shell, kmod, Python). What else it must see is mapped explicitly
(guest_view.py says why). vng's exit code says nothing (it is 255 even when the guest command succeeds); what
the guest has to say it writes to result.json in the run folder.

This is the one module that knows virtme-ng's options: the request's devices become `--qemu-opts`, its view
`--rwdir`/`--rodir`, its accel `--disable-kvm`.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.vm import guest_kernel, guest_view, qemu_args
from rdna1_kmgr.vm.guest import (
    GuestRequest,
    GuestRun,
    StageWatcher,
    console_stages,
    read_result,
    say,
)

NAME = "virtme-ng"
GUEST_MEMORY = "2G"  # an unstripped amdgpu.ko is ~350 MB and is read whole by the kernel
# Loading a module is single-threaded; a second vCPU only made TCG boots ~3 s slower on a 2-core host.
GUEST_CPUS = "1"
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
# With a device passed, udev would autoload the distro's own amdgpu for it before the test loads ours.
PASSTHROUGH_BLACKLIST = ("amdgpu",)

# Console lines that mark boot stages, for progress and for the record's timings.
STAGES = console_stages(
    (re.compile(r"virtme initramfs: mounting hostfs"), "initramfs mounts the host's root"),
    (re.compile(r"virtme-ng-init: basic initialization done"), "guest init done"),
)


@dataclass(frozen=True)
class VirtmeNgGuest:
    vng: str
    qemu: str
    name: str = NAME

    def env(self) -> dict[str, str]:
        # vng runs virtme-run through PATH: the folder vng lives in (a venv's bin) must be on it.
        return {"PATH": os.pathsep.join([str(Path(self.vng).parent), os.environ.get("PATH", "/usr/bin:/bin")])}

    def boot(self, request: GuestRequest) -> GuestRun:
        """Boot the kernel, run the request's command in the guest, and read the result.json it wrote."""
        watcher = StageWatcher(STAGES)
        say(request.booting_line())
        outcome = runner.run_session(
            vng_argv(self, request), request.console, request.timeout, env=self.env(), cwd="/", watch=watcher.feed
        )
        return GuestRun(outcome, request.console, read_result(request.run), tuple(watcher.stages))


def find() -> VirtmeNgGuest:
    beside = Path(sys.executable).parent / "vng"
    vng = str(beside) if beside.is_file() else shutil.which("vng")
    if vng is None:
        raise HostError("virtme-ng (vng) is not installed", "pip install virtme-ng (into rdna1-kmgr's environment)")
    qemu = qemu_args.find_qemu()
    if shutil.which("busybox") is None:
        # virtme-ng builds an initramfs with busybox for distro kernels (their 9p and virtio are modules).
        raise HostError("busybox is not installed", "apt-get install busybox-static")
    return VirtmeNgGuest(vng, qemu)


def vng_argv(guest: VirtmeNgGuest, request: GuestRequest) -> list[str]:
    if request.view is None or request.command is None:
        raise ValueError("a virtme-ng guest runs a command and needs the view of the host it gets")
    blacklist = GUEST_BLACKLIST + (PASSTHROUGH_BLACKLIST if request.devices else ())
    argv = [
        guest.vng,
        "--run",
        str(request.kernel.image),
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
        guest.qemu,
        # virtiofsd is tried first otherwise; where it cannot start, vng waits ~5 s before using 9p.
        "--force-9p",
        *view_args(request.view),  # the run folder, and whatever else the guest must see (guest_view)
        *kernel_args(request.kernel),
        "--append",
        "modprobe.blacklist=" + ",".join(blacklist),
    ]
    if request.accel == "tcg":
        argv.append("--disable-kvm")
    if request.devices:
        argv += passthrough_args(request.devices)
    return argv + ["--exec", request.command]


def view_args(view: guest_view.GuestView) -> list[str]:
    return [arg for mapping in view.mappings for arg in mapping_args(mapping)]


def mapping_args(mapping: guest_view.Mapping) -> list[str]:
    # vng hands --rodir/--rwdir to virtme-run through a shell line, unquoted (guest_view.MAPPABLE).
    if not guest_view.MAPPABLE.fullmatch(str(mapping.host)):
        raise HostError(
            f"virtme-ng cannot show {mapping.host} to the guest (only letters, digits and _ + / . - "
            "can be in a mapped path)",
            "install rdna1-kmgr, or set RDNA1_KMGR_CACHE / TMPDIR, under such a path",
        )
    return ["--rwdir" if mapping.writable else "--rodir", f"{mapping.guest}={mapping.host}"]


def kernel_args(kernel: guest_kernel.GuestKernel) -> list[str]:
    """A kernel unpacked into the cache, read-only at its own host path: virtme-run's /lib/modules/KREL link in
    the guest names the host path of its module folder (guest_view.py), and the guest's init hides /var/cache
    under a tmpfs. An installed kernel's modules are where virtme looks anyway (use_root_mods)."""
    if kernel.origin != "cache":
        return []
    return mapping_args(guest_view.Mapping(PurePosixPath(kernel.root), kernel.root))


def passthrough_args(devices: tuple[str, ...]) -> list[str]:
    """What vng needs beyond an emulated run: the devices, and q35 (microvm has no PCI). 9p is every run's."""
    # vng hands --qemu-opts to a shell: every word here is fixed text or a validated address.
    return ["--disable-microvm", "--qemu-opts=" + " ".join(qemu_args.vfio_devices(devices))]
