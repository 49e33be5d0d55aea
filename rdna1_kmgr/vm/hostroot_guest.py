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
Root's secrets are not the command's to see: the init mounts an empty tmpfs over root's home and the folders of
the module-signing keys, and an empty file over /etc/shadow, /etc/gshadow, each signing key and the SSH host
keys, right after the host's root and before anything runs (`hidden`). QEMU's 9p server has no way to leave a
path out of a share, and it runs as root: a guest kernel that wanted to could still reach them over 9p; what the
masks keep from the guest is every program of it (the command, the module's self-test, a core dump, a log).

The initramfs holds busybox, the modules that reach the host's files (virtio over PCI and 9p, from the kernel's
own tree), the mount table, the command and qemu/hostroot/init, which mounts, runs and powers off. Runs with a
device passed stay on virtme-ng: there udev makes a passed GPU's device nodes and links as on a desktop.
"""

from __future__ import annotations

import gzip
import lzma
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError, SourceError
from rdna1_kmgr.host import platform
from rdna1_kmgr.vm import busybox_initramfs, guest_kernel, guest_view, qemu_args
from rdna1_kmgr.vm.guest import (
    GuestRequest,
    GuestRun,
    StageWatcher,
    console_stages,
    read_result,
    say,
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
# What the guest must not see of the host (their real paths, where they exist): root's home, the shadow files, the
# SSH host keys and every distribution's module-signing private key and its folder (host/platforms.toml).
SECRET_FOLDERS = ("/root",)
SECRET_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/ssh/ssh_host_*_key")
EMPTY_FILE = "/hidden"  # in the initramfs: what a secret file shows in the guest
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

    def boot(self, request: GuestRequest) -> GuestRun:
        """Boot the kernel with an initramfs written into the run folder; run the command; read result.json."""
        if request.view is None or request.command is None:
            raise ValueError("the host-root guest runs a command and needs the view of the host it gets")
        if request.devices:
            raise ValueError("the host-root guest has no passthrough: devices go to the virtme-ng guest")
        shares, mounts = layout(request.kernel, request.view)
        initramfs = build_initramfs(request.run / "initramfs.cpio", request.kernel, mounts, request.command)
        watcher = StageWatcher(STAGES)
        say(request.booting_line())
        argv = qemu_argv(self.qemu, request.image_to_boot(), initramfs, request.accel, shares)
        outcome = runner.run_session(argv, request.console, request.timeout, cwd="/", watch=watcher.feed)
        return GuestRun(outcome, request.console, read_result(request.run), tuple(watcher.stages))


def find() -> HostRootGuest:
    qemu = qemu_args.find_qemu()
    busybox_initramfs.static_busybox()  # refuse now, with what to install, not after the boot
    return HostRootGuest(qemu)


def hidden() -> tuple[list[Path], list[Path]]:
    """(folders, files) of the host the guest must not see, by their real paths, those that exist."""
    pairs = platform.key_pairs()
    # A folder that holds only a private key is hidden whole (akmods' private/); one shared with its certificate
    # (DKMS's /var/lib/dkms, shim-signed's mok/) keeps the certificate and loses the key.
    folders = [Path(p) for p in SECRET_FOLDERS] + sorted({p.key.parent for p in pairs if p.key.parent != p.cert.parent})
    files = sorted({p.key for p in pairs})
    for pattern in SECRET_FILES:
        files += sorted(Path("/").glob(pattern.lstrip("/")))
    real_folders = [Path(os.path.realpath(f)) for f in folders if f.is_dir()]
    real_files = [
        Path(os.path.realpath(f))
        for f in files
        if f.is_file() and not any(Path(os.path.realpath(f)).is_relative_to(d) for d in real_folders)
    ]
    return list(dict.fromkeys(real_folders)), list(dict.fromkeys(real_files))


def masks(folders: list[Path], files: list[Path]) -> list[Mount]:
    """The mounts that hide them: an empty tmpfs on a folder (root's home stays writable, as a home is), the
    initramfs's empty file bound on a file."""
    found = [
        Mount("tmpfs", "tmpfs", PurePosixPath(f), "nosuid,nodev,mode=0700" if str(f) == "/root" else "ro,mode=0700")
        for f in folders
    ]
    return found + [Mount("none", EMPTY_FILE, PurePosixPath(f), "bind") for f in files]


def layout(
    kernel: guest_kernel.GuestKernel,
    view: guest_view.GuestView,
    secrets: tuple[list[Path], list[Path]] | None = None,
) -> tuple[list[Share], list[Mount]]:
    """The 9p shares QEMU exports and the mount table the guest mounts them with, in order: the host's root, then
    the masks over its secrets (`hidden()` unless given), then the rest."""
    root = Share("hostroot", Path("/"))
    shares = [root]
    folders, files = secrets if secrets is not None else hidden()
    for path in (*folders, *files):
        if not guest_view.MAPPABLE.fullmatch(str(path)):
            raise HostError(
                f"the guest cannot hide {path} (only letters, digits and _ + / . - can be in a mount table's path)",
                f"rename {path}, or run `vm-test gpu BDF` (the virtme-ng guest)",
            )
    mounts = [
        Mount("9p", root.tag, PurePosixPath("/"), READ_ONLY),
        *masks(folders, files),
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
        busybox_initramfs.text(EMPTY_FILE.lstrip("/"), b""),
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
