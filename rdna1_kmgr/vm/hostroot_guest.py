"""The host-root guest ("host-root" in guest_registry) of an emulated vm-test: plain QEMU, the kernel, and a
busybox initramfs that mounts the host's root file system read-only over 9p and runs the request's command in
it. No init system runs.

Why not virtme-ng for this run: before the command, virtme-ng's guest init runs systemd-tmpfiles, starts udevd,
triggers the coldplug twice and waits for udev to settle: 6.2 s of a 24 s emulated verdict under TCG, measured
on Debian's 6.1 (tmpfiles 1.5 s, udev 4.7 s; every systemd program start pays for libsystemd-shared's
relocations, and udev then works through the 265 devices of the emulated machine). An emulated run needs none
of it: no device of it is of interest, nothing is plugged in, and the guest side loads its modules itself
(`modprobe -a` of the dependencies, `insmod` of the module under test). devtmpfs makes /dev/kmsg.

What the command sees is what virtme-ng shows it (guest_view.py): the host's root, read-only; fresh tmpfs on
/run, /tmp and /var/tmp; the view's mappings at their guest paths; the kernel's own modules at
/lib/modules/KREL (a tmpfs over /lib/modules with the cached kernel's folder in it, as virtme-ng does it).
The initramfs holds busybox, the modules that reach the host's files (virtio over PCI and 9p, from the kernel's
own tree), the mount table, the command and qemu/hostroot/init, which mounts, runs and powers off. Runs with a
device passed stay on virtme-ng: there udev makes a passed GPU's device nodes and links as on a desktop.
"""

from __future__ import annotations

import gzip
import lzma
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError, SourceError
from rdna1_kmgr.vm import busybox_initramfs, guest_kernel, guest_view, qemu_args
from rdna1_kmgr.vm.guest import (
    GuestRequest,
    GuestRun,
    Reporter,
    StageWatcher,
    console_stages,
    read_result,
)

NAME = "host-root"
MEMORY_MB = 2048  # as the virtme-ng guest: an unstripped amdgpu.ko (~350 MB) is read whole by the kernel
# What the initramfs loads to reach the host's files; the kernel's modprobe resolves each to its files.
ROOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
NINE_P = "trans=virtio,version=9p2000.L,access=any,msize=524288"  # as virtme-ng mounts the host's root
# A read-only share does not change while the guest runs: its files and lookups may stay in the guest's page and
# dentry caches (9p's loose cache), where without it every stat and read goes to the host (Python's start reads
# a few hundred files). A writable share keeps 9p's default, no cache: what the guest writes is on the host.
READ_ONLY = f"ro,cache=loose,{NINE_P}"
READ_WRITE = f"rw,{NINE_P}"
CPU_UNDER_TCG = "max"  # what virtme-ng asks QEMU for under TCG: the guest kernel sees the same CPU either way
STAGES = console_stages((re.compile(r"rdna1-kmgr-guest: the host's root is mounted"), "the host's root mounted"))


@dataclass(frozen=True)
class Share:
    """A host folder handed to the guest as a 9p device."""

    tag: str
    host: Path
    writable: bool = False


@dataclass(frozen=True)
class Mount:
    """One line of the guest's mount table, mounted in order below the new root."""

    fstype: str
    source: str  # a share's tag, or the file system's own name
    path: PurePosixPath
    options: str

    def line(self) -> str:
        return f"{self.fstype} {self.source} {self.path} {self.options}\n"


@dataclass(frozen=True)
class HostRootGuest:
    qemu: str
    name: str = NAME

    def boot(self, request: GuestRequest, report: Reporter) -> GuestRun:
        """Boot the kernel with an initramfs written into the run folder; run the command; read result.json."""
        if request.view is None or request.command is None:
            raise ValueError("the host-root guest runs a command and needs the view of the host it gets")
        if request.devices:
            raise ValueError("the host-root guest has no passthrough: devices go to the virtme-ng guest")
        shares, mounts = layout(request.kernel, request.view)
        initramfs = build_initramfs(request.run / "initramfs.cpio", request.kernel, mounts, request.command)
        watcher = StageWatcher(report, STAGES)
        report(request.booting_line())
        argv = qemu_argv(self.qemu, request.image_to_boot(), initramfs, request.accel, shares)
        outcome = runner.run_session(argv, request.console, request.timeout, cwd="/", watch=watcher.feed)
        return GuestRun(outcome, request.console, read_result(request.run), tuple(watcher.stages))


def find() -> HostRootGuest:
    qemu = qemu_args.find_qemu()
    busybox_initramfs.static_busybox()  # refuse now, with what to install, not after the boot
    return HostRootGuest(qemu)


def layout(kernel: guest_kernel.GuestKernel, view: guest_view.GuestView) -> tuple[list[Share], list[Mount]]:
    """The 9p shares QEMU exports and the mount table the guest mounts them with, in order."""
    root = Share("hostroot", Path("/"))
    shares = [root]
    mounts = [
        Mount("9p", root.tag, PurePosixPath("/"), READ_ONLY),
        Mount("proc", "proc", PurePosixPath("/proc"), "nosuid,noexec,nodev"),
        Mount("sysfs", "sysfs", PurePosixPath("/sys"), "nosuid,noexec,nodev"),
        Mount("devtmpfs", "devtmpfs", PurePosixPath("/dev"), "nosuid,mode=0755"),
        Mount("tmpfs", "tmpfs", PurePosixPath("/run"), "nosuid,nodev,mode=0755"),
        Mount("tmpfs", "tmpfs", PurePosixPath("/tmp"), "nosuid,nodev,mode=1777"),
        Mount("tmpfs", "tmpfs", PurePosixPath("/var/tmp"), "nosuid,nodev,mode=1777"),
    ]
    if kernel.origin == "cache":
        modules = Share("modules", kernel.modules)
        shares.append(modules)
        mounts += [
            Mount("tmpfs", "tmpfs", PurePosixPath("/lib/modules"), "mode=0755"),
            Mount("9p", modules.tag, PurePosixPath("/lib/modules") / kernel.release, READ_ONLY),
        ]
    for n, mapping in enumerate(view.mappings):
        if not guest_view.MAPPABLE.fullmatch(str(mapping.guest)):
            raise HostError(
                f"the guest cannot mount at {mapping.guest} (only letters, digits and _ + / . - can be in it)",
                "install rdna1-kmgr, or set RDNA1_KMGR_CACHE / TMPDIR, under such a path",
            )
        share = Share(f"map{n}", Path(mapping.host), mapping.writable)
        shares.append(share)
        mounts.append(Mount("9p", share.tag, mapping.guest, READ_WRITE if share.writable else READ_ONLY))
    return shares, mounts


def qemu_argv(qemu: str, image: Path, initramfs: Path, accel: str, shares: list[Share]) -> list[str]:
    """A bare q35 guest (no default devices) with the shares as virtio-9p devices and its console on stdout."""
    argv = qemu_args.q35_initramfs_guest(
        qemu, accel, MEMORY_MB, image, "console=ttyS0 panic=-1 rdinit=/init", initramfs, tcg_cpu=CPU_UNDER_TCG
    )
    for n, share in enumerate(shares):
        path = str(share.host).replace(",", ",,")  # QEMU's option syntax doubles a comma in a value
        readonly = "" if share.writable else ",readonly=on"
        argv += ["-fsdev", f"local,id=share{n},path={path},security_model=none,multidevs=remap{readonly}"]
        argv += ["-device", f"virtio-9p-pci,fsdev=share{n},mount_tag={share.tag}"]
    return argv


def init_script() -> Path:
    return Path(str(resources.files("rdna1_kmgr.qemu") / "hostroot" / "init"))


def build_initramfs(dest: Path, kernel: guest_kernel.GuestKernel, mounts: list[Mount], command: str) -> Path:
    """busybox, the modules that reach the host's files in their load order, the mount table, the command and
    the init script, as an uncompressed cpio archive at `dest`."""
    files = []
    for name in ROOT_MODULES:
        files += [f for f in guest_kernel.load_order(kernel.root, kernel.release, name) if f not in files]
    if not files and not _built_in(kernel):
        raise SourceError(
            f"kernel {kernel.release} has no 9p or virtio modules in {kernel.modules}",
            "vm-test --yes fetches the kernel's image package again",
        )
    entries = [busybox_initramfs.folder("modules")]
    names = []
    for file in files:
        name = re.sub(r"\.(xz|gz|zst)$", "", file.name)
        names.append(name)
        entries.append(busybox_initramfs.text(f"modules/{name}", _module_bytes(file)))
    entries += [
        busybox_initramfs.text("modules/order", "".join(f"{name}\n" for name in names).encode()),
        busybox_initramfs.text("mounts", "".join(mount.line() for mount in mounts).encode()),
        busybox_initramfs.text("command", command.encode() + b"\n"),
    ]
    return busybox_initramfs.write(dest, init_script().read_bytes(), entries)


def _built_in(kernel: guest_kernel.GuestKernel) -> bool:
    """Whether 9p and virtio's PCI transport are part of the kernel image itself (modules.builtin)."""
    try:
        builtin = (kernel.modules / "modules.builtin").read_text()
    except OSError:
        return False
    return all(re.search(rf"/{name}\.ko$", builtin, re.M) for name in ("9p", "9pnet_virtio", "virtio_pci"))


def _module_bytes(file: Path) -> bytes:
    """A module file as busybox's insmod loads it: uncompressed (Ubuntu's are .ko.zst, others .ko.xz)."""
    if file.suffix == ".xz":
        return lzma.decompress(file.read_bytes())
    if file.suffix == ".gz":
        return gzip.decompress(file.read_bytes())
    if file.suffix == ".zst":
        return runner.run(["zstd", "-d", "-c", "-q", str(file)], text=False, doing=f"unpacking {file.name}").stdout
    return file.read_bytes()
