"""A whole Debian 12 or 13 system in QEMU: boot loader, initramfs, systemd and a kernel of its own, on a disk image.

For tests that a `vng` guest (the host's root file system, a kernel booted directly) cannot answer: what GRUB
does at boot, what the initramfs loads before the root file system is mounted, what systemd units do, what
survives a VM killed in the middle of a boot.

The base image is built once per kernel release and recipe version, and cached (~3-6 min the first time):

    $RDNA1_KMGR_TEST_CACHE/wholesystem/debian12-<KREL>-r<RECIPE>.img   raw disk, one MBR partition (ext4)

    debootstrap (minbase) from the Debian archive the machine's own apt sources name, then in a chroot the
    image's apt (the host's Debian sources, so bookworm-security's kernels too): linux-image-<KREL>,
    initramfs-tools, systemd, grub-pc, dkms, python3; `amdgpu` listed in /etc/initramfs-tools/modules so the
    initramfs loads it before the root file system is mounted (as on a desktop whose initramfs carries its
    GPU driver), with MODULES=list (update-initramfs with MODULES=most takes 10+ min under TCG); GRUB and
    the kernel on the serial console; then a first boot (kernel and initrd given to
    QEMU directly) runs grub-install on the disk and update-grub, so every later boot goes through GRUB.

A Debian 13 kind, "debian13" (Release TRIXIE, its own recipe number; ~3.5 min the first time here):

    $RDNA1_KMGR_TEST_CACHE/wholesystem/debian13-<KREL>-r<RECIPE>.img   as above, 16 GB sparse (~1 GB used)

    the same recipe from trixie: debootstrap trixie from the archive the machine's apt gives for bookworm, the
    image's apt listing trixie, trixie-security (from the machine's security archive), -updates and -backports;
    KREL is the kernel trixie-security's linux-headers-amd64 points to today (6.12.x+deb13); then the tool goes
    in as the README says: a copy of this checkout in /root/rdna1-kmgr and its ./install.sh run in the chroot
    (trixie's Python 3.13, dkms, gcc-14, initramfs-tools and QEMU installed by it, the kernel hooks placed),
    with this machine's local CA certificates and pip.conf so that pip reaches the registries. Tests re-run
    install_by_readme on their copy: the cached image may hold an older checkout's tool.

A second kind, "uefi-sb", is made from the base image (~1-2 min, cached beside it, its own recipe number):

    $RDNA1_KMGR_TEST_CACHE/wholesystem/debian12-<KREL>-uefi-sb-r<UEFI_RECIPE>.img   GPT: ESP (FAT32) + ext4
    $RDNA1_KMGR_TEST_CACHE/wholesystem/debian13-<KREL>-uefi-sb-r<UEFI_RECIPE>.img   the same from trixie's base

    the base's root file system copied (`cp -a`) onto a GPT disk after a 200 MB EFI system partition (mounted
    at /boot/efi in the guest; /boot/grub stays on ext4, where the boot guard's grubenv must be), then in a
    chroot Debian's signed chain: shim-signed, grub-efi-amd64-signed (grub-pc goes), mokutil; the kernel is
    already Debian's signed one. This host's kernel cannot mount FAT, so one boot (SeaBIOS, the kernel given
    to QEMU) runs grub-install --uefi-secure-boot --no-nvram --force-extra-removable and update-grub: shim is
    also \\EFI\\BOOT\\BOOTX64.EFI, which OVMF starts with no boot entry. Its systems boot OVMF with Secure Boot
    on (q35, SMM, Microsoft's keys in a variable store of their own), the serial console on a socket (keys
    can be typed into MokManager) and QMP (screendumps).

Each test session copies the base image (sparse) and puts what it tests into the copy while it is not running
(`new_system` copies it, `System.files()` mounts the copy). A boot runs QEMU (TCG: KVM hangs here) under a hard
timeout with the serial
console in a log; the image's `wholesystem-step.service` runs /var/lib/wholesystem/step.sh once the
multi-user target is reached, keeps its output in step.out/step.rc, says `WHOLESYSTEM-STEP-DONE` on the
console and powers the guest off. A boot can also be cut short (the VM destroyed) when the console shows a
given line.

Everything here needs root (loop devices, mount, chroot); without it, or without debootstrap or QEMU, the
fixture skips with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import persistent_cache_root
from log_writes import sparse_copy

RECIPE = 2  # bump when the image recipe changes: a new cached image is built
DISK_SIZE = 6 << 30  # sparse; ~1.6 GB used
PART_OFFSET = 1 << 20  # the partition starts at 1 MiB (sector 2048), room for GRUB's core image
# The UEFI Secure Boot image: GPT, an EFI system partition first, the root file system after it.
UEFI_RECIPE = 1  # bump when the UEFI image recipe changes
ESP_SIZE = 200 << 20
UEFI_ROOT_OFFSET = PART_OFFSET + ESP_SIZE
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")  # Microsoft's keys enrolled, as on a bought PC
# Debian's signed chain; grub-efi-amd64 replaces grub-pc (they conflict), the rest of PACKAGES is the base's.
UEFI_PACKAGES = ["shim-signed", "grub-efi-amd64-signed", "grub-efi-amd64", "mokutil", "grub-pc-"]
STEP_DIR = "var/lib/wholesystem"
STEP_DONE = "WHOLESYSTEM-STEP-DONE"
PACKAGES = [
    "systemd-sysv",
    "udev",
    "dbus",
    "initramfs-tools",
    "zstd",
    "kmod",
    "grub-pc",
    "dkms",
    "python3",
    "procps",
    "util-linux",
    "login",
    "openssl",
]

STEP_UNIT = f"""\
[Unit]
Description=wholesystem test step (/{STEP_DIR}/step.sh)
After=multi-user.target
ConditionPathExists=/{STEP_DIR}/step.sh

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'mv /{STEP_DIR}/step.sh /{STEP_DIR}/step.run; \\
    /bin/sh -x /{STEP_DIR}/step.run > /{STEP_DIR}/step.out 2>&1; echo $? > /{STEP_DIR}/step.rc; sync; \\
    echo "{STEP_DONE} rc=$(cat /{STEP_DIR}/step.rc)" > /dev/ttyS0'
ExecStartPost=/bin/systemctl poweroff --no-block
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
"""

GRUB_DEFAULTS = """\
# wholesystem test image: GRUB and the kernel talk on the serial console, no menu delay.
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=ttyS0,115200 net.ifnames=0"
GRUB_TERMINAL=serial
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
GRUB_DISABLE_OS_PROBER=true
"""


def _run(argv: list[str], timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    return proc


def debian_sources() -> list[tuple[str, list[str]]]:
    """(URI, suites) of the Debian archives the machine's own apt sources list (main component), in order."""
    found: list[tuple[str, list[str]]] = []
    parts = Path("/etc/apt/sources.list.d")
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        for stanza in path.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith((" ", "#")):
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes") == "no" or "deb" not in fields.get("types", "").split():
                continue
            if "main" in fields.get("components", "").split() and "debian" in fields.get("signed-by", "debian"):
                for uri in fields.get("uris", "").split():
                    found.append((uri, fields.get("suites", "").split()))
    for path in [Path("/etc/apt/sources.list"), *sorted(parts.glob("*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line).split()
            if len(words) >= 4 and words[0] == "deb" and "main" in words[3:]:
                found.append((words[1], [words[2]]))
    return [(uri, suites) for uri, suites in found if any(s.startswith("bookworm") for s in suites)]


@dataclass(frozen=True)
class Release:
    """The Debian release a base image is made of: its codename, its suites (each from the archive the
    machine's apt sources give for the same kind of suite: -security from the security archive, the others from
    the release's), the image's size, and whether the tool goes in by the README's `./install.sh` in a chroot."""

    name: str  # in the image's file name: debian12, debian13
    codename: str
    suites: tuple[str, ...]  # suffixes of the codename: "", "-security", ...
    recipe: int
    disk_size: int
    install_sh: bool

    def sources(self) -> list[tuple[str, list[str]]]:
        """(URI, suites) for the image's apt: the host's own bookworm entries, or the same archives for another
        release (the host's bookworm archive for the release and its -updates/-backports, its bookworm-security
        archive for -security)."""
        host = debian_sources()
        if self.codename == "bookworm":
            return host
        release = next((uri for uri, suites in host if "bookworm" in suites), None)
        security = next((uri for uri, suites in host if "bookworm-security" in suites), None)
        found = []
        for suffix in self.suites:
            uri = security if suffix == "-security" else release
            if uri is not None:
                found.append((uri, [self.codename + suffix]))
        return found


BOOKWORM = Release("debian12", "bookworm", ("", "-security", "-updates"), RECIPE, DISK_SIZE, install_sh=False)
# trixie-backports listed, as on a desktop that takes its newer kernels from there (apt's default pin keeps
# them out until asked for): the follow story installs its 7.x kernel from it.
TRIXIE = Release("debian13", "trixie", ("", "-security", "-updates", "-backports"), 1, 16 << 30, install_sh=True)


# A root login shell's environment for the tool's commands run natively in a powered-off system (System.chroot).
ROOT_LOGIN_ENV = {
    "HOME": "/root",
    "TERM": "dumb",
    "LANG": "C.UTF-8",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "DEBIAN_FRONTEND": "noninteractive",
}


def trixie_build_cache() -> dict[Path, str]:
    """The compiler cache the tool's builds in a Debian 13 system use (System.chroot's binds), kept between runs
    in the test cache, apart from the Debian 12 builds' (trixie's gcc-14 objects only): every story that builds
    a trixie kernel shares it, so each kernel compiles once (a warm run recompiles nothing that did not change)."""
    from conftest import persistent_cache_root

    cache = persistent_cache_root() / "ccache-debian13"
    cache.mkdir(exist_ok=True)
    return {cache: "var/cache/rdna1-kmgr/ccache"}


def _mbr(disk_size: int) -> bytes:
    """A DOS partition table with one bootable Linux partition from 1 MiB to the end."""
    start = PART_OFFSET // 512
    count = disk_size // 512 - start
    entry = struct.pack("<B3sB3sII", 0x80, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff", start, count)
    return b"\0" * 446 + entry + b"\0" * 48 + b"\x55\xaa"


@contextlib.contextmanager
def loop_device(image: Path, offset: int = PART_OFFSET, readonly: bool = False) -> Iterator[str]:
    """A loop device over the image from `offset` (the partition's), detached when done."""
    ro = ["--read-only"] if readonly else []
    loop = _run(["losetup", "--find", "--show", *ro, "--offset", str(offset), str(image)]).stdout.strip()
    try:
        yield loop
    finally:
        subprocess.run(["losetup", "-d", loop])


@contextlib.contextmanager
def mounted(
    image: Path, offset: int = PART_OFFSET, readonly: bool = False, options: str | None = None
) -> Iterator[Path]:
    """The image's file system mounted on a scratch folder (a loop device at the partition's offset); `options`
    replaces the mount options (`ro` when read-only). RuntimeError when it does not mount."""
    with loop_device(image, offset, readonly) as loop:
        where = Path(f"/run/wholesystem-{os.getpid()}-{Path(loop).name}")
        where.mkdir(parents=True, exist_ok=True)
        try:
            options = options or ("ro" if readonly else None)
            _run(["mount", *(["-o", options] if options else []), loop, str(where)])
            try:
                yield where
            finally:
                subprocess.run(["sync", "-f", str(where)])
                _run(["umount", str(where)])
        finally:
            where.rmdir()


@contextlib.contextmanager
def _chroot_mounts(root: Path) -> Iterator[None]:
    done = []
    try:
        for fs, target, opts in (
            ("proc", "proc", []),
            ("sysfs", "sys", []),
            ("/dev", "dev", ["--bind"]),
            ("/dev/pts", "dev/pts", ["--bind"]),
        ):
            argv = ["mount", *opts, fs, str(root / target)] if opts else ["mount", "-t", fs, fs, str(root / target)]
            _run(argv)
            done.append(root / target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-l", str(target)])


@dataclass(frozen=True)
class Kind:
    """What a disk image boots with: where its root file system starts, and UEFI firmware or not."""

    name: str
    root_offset: int
    uefi: bool


BIOS = Kind("bios", PART_OFFSET, uefi=False)
UEFI_SB = Kind("uefi-sb", UEFI_ROOT_OFFSET, uefi=True)


@dataclass(frozen=True)
class Firmware:
    """OVMF with Secure Boot on: the shared code, and this system's own variable store (its MOK list, the
    Microsoft keys it starts with)."""

    code: Path
    vars: Path

    def qemu_args(self, log: Path, sockets: Path) -> list[str]:
        # smm=on and the secure flash: OVMF's secboot build refuses to run without SMM protecting its variables.
        # The serial port is a socket (keys can be typed into MokManager) that still logs everything it says;
        # the standard VGA is there for screendump, over QMP.
        return [
            "-machine",
            "q35,smm=on",
            "-global",
            "driver=cfi.pflash01,property=secure,value=on",
            "-global",
            "ICH9-LPC.disable_s3=1",
            "-drive",
            f"if=pflash,format=raw,unit=0,readonly=on,file={self.code}",
            "-drive",
            f"if=pflash,format=raw,unit=1,file={self.vars}",
            "-chardev",
            f"socket,id=ser0,path={sockets / 'serial'},server=on,wait=off,logfile={log}",
            "-serial",
            "chardev:ser0",
            "-qmp",
            f"unix:{sockets / 'qmp'},server=on,wait=off",
            "-vga",
            "std",
        ]


class GuestConsole:
    """A running UEFI guest's serial console (all it said so far; keys typed into it) and its screen."""

    def __init__(self, sockets: Path, timeout: float = 30):
        deadline = time.monotonic() + timeout
        self.serial = self._connect(sockets / "serial", deadline)
        self.qmp = self._connect(sockets / "qmp", deadline)
        self._said = bytearray()
        self._lock = threading.Lock()
        self.closed = False
        # Drained all the time: a console nobody reads fills the socket and stalls the guest's output.
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self._qmp_file = self.qmp.makefile("rb")
        self._qmp_file.readline()  # the greeting
        self._qmp_command("qmp_capabilities")

    @staticmethod
    def _connect(path: Path, deadline: float) -> socket.socket:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(path))
                return sock
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _drain(self) -> None:
        while True:
            try:
                data = self.serial.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.closed = True
                return
            with self._lock:
                self._said += data

    def raw(self) -> str:
        """All the console said so far, one character per byte (escape sequences and CP437 box lines as sent)."""
        with self._lock:
            return self._said.decode("latin-1")

    def send(self, keys: bytes) -> None:
        self.serial.sendall(keys)

    def _qmp_command(self, name: str, **arguments) -> dict:
        self.qmp.sendall(json.dumps({"execute": name, "arguments": arguments}).encode() + b"\n")
        while True:
            line = self._qmp_file.readline()
            if not line:
                raise RuntimeError(f"QMP closed during {name}")
            answer = json.loads(line)
            if "return" in answer or "error" in answer:  # events come in between
                if "error" in answer:
                    raise RuntimeError(f"QMP {name}: {answer['error']}")
                return answer

    def screendump(self, path: Path) -> None:
        """The guest's display as a PNG file (QEMU 7.1 and later write PNG themselves)."""
        self._qmp_command("screendump", filename=str(path), format="png")

    def close(self) -> None:
        for sock in (self.serial, self.qmp):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@dataclass
class Boot:
    console: str  # the serial console, GRUB to power-off
    seconds: float
    killed: bool  # the VM was destroyed when `kill_on` showed up
    timed_out: bool
    step_rc: int | None = None
    step_out: str = ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.console.splitlines()[-lines:])


def qemu_boot(
    image: Path,
    log: Path,
    timeout: float,
    kill_on: str | None = None,
    kernel: tuple[Path, Path, str] | None = None,
    firmware: Firmware | None = None,
    driver: Callable[[GuestConsole], None] | None = None,
    write_log: Path | None = None,
) -> Boot:
    """Boot the disk under TCG; destroy the VM when the console shows `kill_on`, or at `timeout`.

    With `firmware` the machine boots OVMF (Secure Boot on) instead of SeaBIOS, and `driver`, when given, runs
    beside the boot with the guest's console (to answer the firmware's prompts); its failure ends the boot and
    is raised. With `write_log` every write and flush the guest makes to the disk is also logged there, in
    dm-log-writes' format, by QEMU's blklogwrites driver (tests/log_writes.py replays it)."""
    # -cpu max: TCG's default CPU (qemu64) lacks SSE4, which PyTorch's oneDNN needs for a convolution.
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-m",
        "2048",
        "-smp",
        "2",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
    ]
    # A short folder for the sockets: a unix socket's path has a 107-byte limit that test folders can pass.
    sockets = Path(tempfile.mkdtemp(prefix="ws-", dir="/run")) if firmware else None
    if firmware:
        argv += firmware.qemu_args(log, sockets)
    else:
        argv += ["-serial", f"file:{log}", "-monitor", "none", "-vga", "none"]
    argv += disk_args(image, write_log)
    if kernel:
        argv += ["-kernel", str(kernel[0]), "-initrd", str(kernel[1]), "-append", kernel[2]]
    log.write_bytes(b"")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    killed = timed_out = False
    console = helper = None
    failures: list[BaseException] = []
    try:
        if firmware:
            try:
                console = GuestConsole(sockets)
            except OSError as err:  # QEMU never opened its sockets: its own message says why
                failures.append(RuntimeError(f"no console from QEMU ({err})"))
        if driver:
            helper = threading.Thread(target=_drive, args=(driver, console, failures), daemon=True)
            helper.start()
        while proc.poll() is None:
            if kill_on and kill_on in log.read_text(errors="replace"):
                killed = True
                break
            if time.monotonic() - started > timeout:
                timed_out = True
                break
            if failures:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # a power cut: nothing in the guest gets to run
        proc.wait()
        if console:
            console.close()
        if helper:
            helper.join(30)
        if sockets:
            shutil.rmtree(sockets, ignore_errors=True)
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    text = log.read_text(errors="replace")
    if failures:
        raise RuntimeError(f"{failures[0]}\nQEMU said: {output[-2000:]}") from failures[0]
    if proc.returncode not in (0, -signal.SIGKILL) and not (killed or timed_out):
        raise RuntimeError(f"qemu failed ({proc.returncode}): {output[-2000:]}")
    return Boot(text, time.monotonic() - started, killed, timed_out)


def disk_args(image: Path, write_log: Path | None) -> list[str]:
    """The disk as the guest's virtio disk, its write cache on (the guest flushes it as on real hardware). With
    `write_log`, through blklogwrites: the raw image under it, the log file (which must exist, empty) beside it,
    and virtio-blk's request merging off. blklogwrites logs a write as its header then its data, one I/O vector
    more than the request: a merged request can carry IOV_MAX (1024) vectors already, and then the log's write
    fails (EINVAL), which the guest sees as an I/O error. Merging happens when requests queue up, so on a busy
    host: a recording in CI's second lane failed so, at 81 s, writing an initramfs. Unmerged, a request has at
    most the queue's 254 segments."""
    if write_log is None:
        return ["-drive", f"file={image},format=raw,if=virtio,cache=writeback"]
    write_log.write_bytes(b"")
    return [
        "-blockdev",
        f"driver=file,node-name=disk-file,filename={image}",
        "-blockdev",
        "driver=raw,node-name=disk-format,file=disk-file",
        "-blockdev",
        f"driver=file,node-name=log-file,filename={write_log}",
        "-blockdev",
        "driver=blklogwrites,node-name=disk-logged,file=disk-format,log=log-file,log-sector-size=512",
        "-device",
        "virtio-blk-pci,drive=disk-logged,request-merging=off",
    ]


def _drive(driver: Callable[[GuestConsole], None], console: GuestConsole, failures: list[BaseException]) -> None:
    try:
        driver(console)
    except BaseException as err:  # handed to the boot's thread, which raises it once the VM is gone
        failures.append(err)


def take_kernel(root: Path, kernel: str, work: Path) -> None:
    """The image's kernel and initramfs, copied out for its first boot."""
    shutil.copy(root / f"boot/vmlinuz-{kernel}", work / "vmlinuz")
    shutil.copy(root / f"boot/initrd.img-{kernel}", work / "initrd")


def first_boot(image: Path, work: Path, root_device: str) -> Boot:
    """A boot of the kernel take_kernel copied, given to QEMU directly: the image has no boot loader yet. systemd
    waits up to 15 min for a device (its default, 90 s, is too short for the cache warmer's boots, which get only
    the CPU time the tests leave: a Debian 13 UEFI image's first boot gave up waiting for /dev/vda1, the EFI
    partition). Both words: the device timeout's own is systemd 254's (trixie); bookworm's 252 takes the start
    jobs' default for devices too, and ignores a word it does not know."""
    timeout = "systemd.default_device_timeout_sec=900 systemd.default_timeout_start_sec=900"
    kernel = (work / "vmlinuz", work / "initrd", f"root={root_device} ro console=ttyS0 {timeout}")
    return qemu_boot(image, work / "firstboot.log", timeout=900, kernel=kernel)


def _build_base(image: Path, kernel: str, work: Path, release: Release = BOOKWORM) -> None:
    sources = release.sources()
    mirror = next((uri for uri, suites in sources if release.codename in suites), None)
    if mirror is None:
        pytest.skip(f"the machine's apt sources list no Debian archive to debootstrap {release.codename} from")
    with open(image, "wb") as disk:
        disk.truncate(release.disk_size)
        disk.write(_mbr(release.disk_size))
    with loop_device(image) as loop:
        _run(["mkfs.ext4", "-q", "-L", "wholesystem", loop])
    with mounted(image) as root:
        _run(
            ["debootstrap", "--variant=minbase", "--include=ca-certificates", release.codename, str(root), mirror],
            timeout=3600,
        )
        (root / "etc/apt/sources.list").write_text(
            "".join(f"deb {uri} {suite} main\n" for uri, suites in sources for suite in suites)
        )
        (root / "etc/hostname").write_text("wholesystem\n")
        (root / "etc/fstab").write_text("/dev/vda1 / ext4 errors=remount-ro 0 1\n")
        (root / "etc/default").mkdir(exist_ok=True)
        (root / "etc/default/grub").write_text(GRUB_DEFAULTS)
        (root / "etc/initramfs-tools").mkdir(parents=True, exist_ok=True)
        # The GPU driver in early boot, as on a desktop. The image's initramfs holds the listed modules only
        # (MODULES=list): update-initramfs with MODULES=most spawns a process per module, 10+ min under TCG.
        (root / "etc/initramfs-tools/modules").write_text(
            "virtio_pci\nvirtio_blk\next4\n# the GPU driver in early boot, as on a desktop\namdgpu\n"
        )
        (root / "etc/initramfs-tools/conf.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/initramfs-tools/conf.d/wholesystem.conf").write_text("MODULES=list\n")
        (root / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")  # no daemons start in the chroot
        (root / "usr/sbin/policy-rc.d").chmod(0o755)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
        with _chroot_mounts(root):
            _run(["chroot", str(root), "apt-get", "update"], env=env)
            _run(
                [
                    "chroot",
                    str(root),
                    "apt-get",
                    "install",
                    "-y",
                    "--no-install-recommends",
                    f"linux-image-{kernel}",
                    *PACKAGES,
                ],
                env=env,
                timeout=3600,
            )
            if release.install_sh:
                install_by_readme(root, env)
            _run(["chroot", str(root), "apt-get", "clean"], env=env)
            _run(["chroot", str(root), "passwd", "-d", "root"], env=env)
        (root / "usr/sbin/policy-rc.d").unlink()
        unit = root / "etc/systemd/system/wholesystem-step.service"
        unit.write_text(STEP_UNIT)
        wants = root / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / unit.name).symlink_to(f"/etc/systemd/system/{unit.name}")
        (root / STEP_DIR).mkdir(parents=True, exist_ok=True)
        (root / STEP_DIR / "step.sh").write_text("grub-install /dev/vda\nupdate-grub\n")
        take_kernel(root, kernel, work)
    # First boot, kernel given directly: the boot loader goes onto the disk from inside (the host has no GRUB).
    boot = first_boot(image, work, "/dev/vda1")
    result = read_step(image)
    if result[0] != 0:
        raise RuntimeError(
            f"grub-install in the first boot failed ({result[0]}): {result[1][-2000:]}\n" f"{boot.tail()}"
        )


CHECKOUT = Path(__file__).resolve().parents[1]  # the tool's source tree these tests run from
CHECKOUT_IN_IMAGE = "root/rdna1-kmgr"


def install_by_readme(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The tool installed in the chroot `root` as the README says (`./install.sh` from a copy of this checkout,
    run as root): the release's own Python, dkms, initramfs-tools and kernel hooks. pip reaches the package
    registries with this machine's trust: its local CA certificates and pip.conf go in first."""
    local_cas = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    if local_cas:
        (root / "usr/local/share/ca-certificates").mkdir(parents=True, exist_ok=True)
        for cert in local_cas:
            shutil.copy(cert, root / "usr/local/share/ca-certificates" / cert.name)
        _run(["chroot", str(root), "update-ca-certificates"], env=env)
    if Path("/etc/pip.conf").is_file():
        shutil.copy("/etc/pip.conf", root / "etc/pip.conf")
    copy = root / CHECKOUT_IN_IMAGE
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(
        CHECKOUT,
        copy,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"),
    )
    return _run(["chroot", str(root), f"/{CHECKOUT_IN_IMAGE}/install.sh"], env=env, timeout=3600)


def facts(out: str) -> dict[str, str]:
    """The `FACT name=value` lines a step printed about the boot it ran in."""
    found = {}
    for line in out.splitlines():
        if line.startswith("FACT "):
            key, _, value = line[5:].partition("=")
            found[key] = value.strip()
    return found


def read_step(image: Path, offset: int = PART_OFFSET) -> tuple[int | None, str]:
    with mounted(image, offset) as root:
        rc_file, out_file = root / STEP_DIR / "step.rc", root / STEP_DIR / "step.out"
        rc = int(rc_file.read_text()) if rc_file.is_file() else None
        out = out_file.read_text(errors="replace") if out_file.is_file() else ""
        for name in ("step.rc", "step.out", "step.run"):
            (root / STEP_DIR / name).unlink(missing_ok=True)
    return rc, out


def _cached_image(folder: Path, name: str, earlier: str, build) -> Path:
    """`folder/name`, made by `build(partial, work)` the first time (several sessions wait for one build under
    its lock); images of earlier recipes (`earlier`, a glob) go when a new one is made: 1.6 GB each."""
    folder.mkdir(parents=True, exist_ok=True)
    image = folder / name
    if image.is_file():  # published whole (os.replace): no need to wait for another kind's build
        return image
    with open(folder / f"{name}.lock", "w") as lock:  # one per image: another kind's build need not wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image.is_file():
            return image
        work = folder / f".build-{name}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        partial = work / image.name
        started = time.monotonic()
        try:
            build(partial, work)
            os.replace(partial, image)
            for older in folder.glob(earlier):
                if older != image:
                    older.unlink()
            (folder / f"{image.name}.seconds").write_text(f"{time.monotonic() - started:.0f}\n")
        finally:
            if os.environ.get("WHOLESYSTEM_KEEP_BUILD"):  # the first boot's console, to see why it failed
                print(f"kept {work}", file=sys.stderr)
            else:
                shutil.rmtree(work, ignore_errors=True)
    return image


def base_image(kernel: str) -> Path:
    """The cached Debian 12 base image for `kernel` (built the first time; several sessions wait for one build)."""
    return release_image(BOOKWORM, kernel)


def release_image(release: Release, kernel: str) -> Path:
    """The cached base image of `release` for `kernel` (built the first time; several sessions wait for one)."""
    return _cached_image(
        persistent_cache_root() / "wholesystem",
        f"{release.name}-{kernel}-r{release.recipe}.img",
        f"{release.name}-{kernel}-r*.img",
        lambda partial, work: _build_base(partial, kernel, work, release),
    )


def _gpt(disk_size: int, parts: list[tuple[str, int, int]]) -> tuple[bytes, bytes, int]:
    """A GPT (UEFI spec, ch. 5) for (type GUID, first byte, size) partitions: the protective MBR with the
    primary header and entries (the disk's start), the backup entries and header (its last 33 sectors), and
    the end of the usable area in bytes. Written here because the host has no sfdisk."""
    sectors = disk_size // 512
    last_usable = sectors - 34
    entries = b""
    for number, (type_guid, start, size) in enumerate(parts):
        last = (start + size) // 512 - 1 if size else last_usable
        name = ("EFI system" if number == 0 else "root").encode("utf-16-le").ljust(72, b"\0")
        entries += uuid.UUID(type_guid).bytes_le + uuid.uuid4().bytes_le + struct.pack("<QQQ", start // 512, last, 0)
        entries += name
    entries = entries.ljust(128 * 128, b"\0")
    disk_guid = uuid.uuid4().bytes_le

    def header(current: int, backup: int, entries_lba: int) -> bytes:
        fields = [b"EFI PART", 0x00010000, 92, 0, 0, current, backup, 34, last_usable, disk_guid, entries_lba, 128]
        packed = struct.pack("<8sIIIIQQQQ16sQIII", *fields, 128, zlib.crc32(entries))
        packed = packed[:16] + struct.pack("<I", zlib.crc32(packed)) + packed[20:]
        return packed.ljust(512, b"\0")

    protective = struct.pack("<B3sB3sII", 0, b"\0\x02\0", 0xEE, b"\xff\xff\xff", 1, min(sectors - 1, 0xFFFFFFFF))
    mbr = b"\0" * 446 + protective + b"\0" * 48 + b"\x55\xaa"
    primary = mbr + header(1, sectors - 1, 2) + entries
    backup = entries + header(sectors - 1, 1, sectors - 33)
    return primary, backup, (last_usable + 1) * 512


ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
LINUX_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"


def _uefi_disk(image: Path, disk_size: int = DISK_SIZE) -> None:
    """A sparse GPT disk: the EFI system partition (FAT32) from 1 MiB, the root file system (ext4) after it."""
    primary, backup, usable_end = _gpt(
        disk_size, [(ESP_TYPE, PART_OFFSET, ESP_SIZE), (LINUX_TYPE, UEFI_ROOT_OFFSET, 0)]
    )
    with open(image, "wb") as disk:
        disk.truncate(disk_size)
        disk.write(primary)
        disk.seek(disk_size - len(backup))
        disk.write(backup)
    for offset, size, mkfs in (
        (PART_OFFSET, ESP_SIZE, ["mkfs.vfat", "-F", "32", "-n", "EFI"]),
        (UEFI_ROOT_OFFSET, usable_end - UEFI_ROOT_OFFSET, ["mkfs.ext4", "-q", "-L", "wholesystem"]),
    ):
        loop = _run(
            ["losetup", "--find", "--show", "--offset", str(offset), "--sizelimit", str(size), str(image)]
        ).stdout.strip()
        try:
            _run([*mkfs, loop])
        finally:
            subprocess.run(["losetup", "-d", loop])


# Run in the first boot of the UEFI image: this host's kernel cannot mount FAT, the guest's can.
UEFI_FIRST_STEP = """\
set -e
mountpoint /boot/efi
# shim as the removable-media loader too (\\EFI\\BOOT\\BOOTX64.EFI): OVMF starts it with no boot entry.
grub-install --target=x86_64-efi --efi-directory=/boot/efi --uefi-secure-boot --no-nvram --force-extra-removable
update-grub
find /boot/efi -type f
"""


def _build_uefi(image: Path, base: Path, work: Path, disk_size: int = DISK_SIZE) -> None:
    """The base image's root file system copied onto a GPT disk with an EFI system partition, Debian's signed
    boot chain installed in a chroot (no second debootstrap), then one boot (SeaBIOS, the kernel given to QEMU)
    puts shim and GRUB on the EFI system partition."""
    _uefi_disk(image, disk_size)
    with mounted(base, readonly=True) as source, mounted(image, UEFI_ROOT_OFFSET) as root:
        _run(["cp", "-a", f"{source}/.", str(root)], timeout=1800)
        (root / "etc/fstab").write_text(
            "/dev/vda2 / ext4 errors=remount-ro 0 1\n/dev/vda1 /boot/efi vfat umask=0077 0 0\n"
        )
        (root / "boot/efi").mkdir(exist_ok=True)
        (root / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
        (root / "usr/sbin/policy-rc.d").chmod(0o755)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
        # The packages' own grub-install (postinst) must not touch NVRAM: there are no EFI variables here.
        selections = "grub-efi-amd64 grub2/update_nvram boolean false\n"
        selections += "grub-efi-amd64 grub2/force_efi_extra_removable boolean true\n"
        with _chroot_mounts(root):
            _run(["chroot", str(root), "debconf-set-selections"], env=env, input=selections)
            _run(["chroot", str(root), "apt-get", "update"], env=env)
            _run(
                ["chroot", str(root), "apt-get", "install", "-y", "--no-install-recommends", *UEFI_PACKAGES],
                env=env,
                timeout=3600,
            )
            _run(["chroot", str(root), "apt-get", "clean"], env=env)
        (root / "usr/sbin/policy-rc.d").unlink()
        (root / STEP_DIR / "step.sh").write_text(UEFI_FIRST_STEP)
        kernel = next(root.glob("boot/vmlinuz-*")).name.removeprefix("vmlinuz-")
        take_kernel(root, kernel, work)
    boot = first_boot(image, work, "/dev/vda2")
    rc, out = read_step(image, UEFI_ROOT_OFFSET)
    (work / "firstboot.step").write_text(out)
    if rc != 0:
        raise RuntimeError(f"grub-install in the first boot failed ({rc}): {out[-2000:]}\n{boot.tail()}")


def uefi_sb_image(kernel: str, release: Release = BOOKWORM) -> Path:
    """The cached UEFI Secure Boot image of `release` for `kernel`, made from its base image the first time
    (the release's own shim-signed, grub-efi-amd64-signed and signed kernel)."""
    base = release_image(release, kernel)
    return _cached_image(
        base.parent,
        f"{release.name}-{kernel}-uefi-sb-r{UEFI_RECIPE}.img",
        f"{release.name}-{kernel}-uefi-sb-r*.img",
        lambda partial, work: _build_uefi(partial, base, work, release.disk_size),
    )


@dataclass(frozen=True)
class WriteLog:
    """A boot recorded write by write (System.boot): the log, and copies of the disk as the boot started from it
    and as the boot left it. Both copies are made by the boot itself, around the guest's run and nothing else:
    the step is written into the disk on the host before `start` (a replay of the log applies the guest's
    writes to exactly what the guest read), and `end` is taken before the host mounts the disk to read the
    step's output (the whole log replayed onto `start` must give `end`, byte for byte)."""

    log: Path
    start: Path
    end: Path


class System:
    """One session's copy of the base image: files put in while it is off, boots with a step each."""

    def __init__(self, image: Path, logs: Path, kind: Kind = BIOS, firmware: Firmware | None = None):
        self.image = image
        self.logs = logs
        self.kind = kind
        self.firmware = firmware
        self.boots: list[Boot] = []
        self.chroots = 0

    @contextlib.contextmanager
    def files(self) -> Iterator[Path]:
        """The powered-off system's root file system, mounted read-write."""
        with mounted(self.image, self.kind.root_offset) as root:
            yield root

    @contextlib.contextmanager
    def entered(self, binds: dict[Path, str] | None = None) -> Iterator[Path]:
        """The powered-off system's root made ready to run its own programs natively: /proc /sys /dev bound in as
        the recipe's are, no daemon starting (policy-rc.d), each of `binds` (a folder of this machine to a path of
        the root) bound in. GRUB's 10_linux gives up on a root loop-mounted from a file, so update-grub is told the
        guest's root device (a grub.d file that lives only as long as this): its linux lines say root=/dev/vdaN,
        with no `search` line."""
        device = "/dev/vda2" if self.kind.uefi else "/dev/vda1"
        with self.files() as root, _chroot_mounts(root):
            added = [root / "etc/default/grub.d/zz-wholesystem-chroot.cfg", root / "usr/sbin/policy-rc.d"]
            added[0].parent.mkdir(parents=True, exist_ok=True)
            added[0].write_text(f"GRUB_DEVICE={device}\nGRUB_DEVICE_BOOT={device}\n")
            added[1].write_text("#!/bin/sh\nexit 101\n")
            added[1].chmod(0o755)
            bound = []
            try:
                for folder, inside in (binds or {}).items():
                    target = root / inside
                    target.mkdir(parents=True, exist_ok=True)
                    _run(["mount", "--bind", str(folder), str(target)])
                    bound.append(target)
                yield root
            finally:
                for target in reversed(bound):
                    subprocess.run(["umount", "-l", str(target)])
                for path in added:
                    path.unlink()

    def chroot(
        self,
        argv: list[str],
        timeout: float = 1800,
        env: dict[str, str] | None = None,
        binds: dict[Path, str] | None = None,
        name: str | None = None,
    ) -> subprocess.CompletedProcess:
        """`argv` run natively in the powered-off system (`entered`): its own update-initramfs, update-grub, dkms
        and offline systemctl, minutes faster than a TCG boot. What reads the running system (uname -r,
        /proc/cmdline, systemd's state, EFI variables) sees this machine's: give the kernel explicitly, and keep
        in a boot what is about a boot. Returns the finished process whatever its status; its output is kept in
        the logs folder (as `name`.log when named). `env` adds to root's PATH, locale and home."""
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LC_ALL": "C",
            "HOME": "/root",
            "DEBIAN_FRONTEND": "noninteractive",
            **(env or {}),
        }
        with self.entered(binds) as root:
            proc = subprocess.run(
                ["chroot", str(root), *argv], capture_output=True, text=True, env=env, timeout=timeout
            )
        self.chroots += 1
        log = self.logs / f"{name or f'chroot-{self.chroots}'}.log"
        log.write_text(
            f"$ {' '.join(argv)}\n{proc.stdout}\n--- stderr\n{proc.stderr}\n(exit status {proc.returncode})\n"
        )
        return proc

    def boot(
        self,
        step: str | None,
        timeout: float = 900,
        kill_on: str | None = None,
        driver: Callable[[GuestConsole], None] | None = None,
        write_log: WriteLog | None = None,
    ) -> Boot:
        """Boot through GRUB; `step` (shell) runs once the multi-user target is reached, then power-off.
        UEFI images boot OVMF, shim and GRUB, and `driver` may answer the firmware's prompts meanwhile.
        With `write_log` the disk's writes and flushes are logged (qemu_boot), and the disk copied before and
        after (WriteLog)."""
        if step is not None:
            with self.files() as root:
                (root / STEP_DIR / "step.sh").write_text(step)
        if write_log:
            sparse_copy(self.image, write_log.start)
        log = self.logs / f"boot-{len(self.boots) + 1}.log"
        boot = qemu_boot(
            self.image,
            log,
            timeout,
            kill_on=kill_on,
            firmware=self.firmware,
            driver=driver,
            write_log=write_log.log if write_log else None,
        )
        if write_log:
            sparse_copy(self.image, write_log.end)
        self.boots.append(boot)
        if step is not None and not boot.killed:
            boot.step_rc, boot.step_out = read_step(self.image, self.kind.root_offset)
            log.with_suffix(".step").write_text(f"{boot.step_out}\n(exit status {boot.step_rc})\n")
        return boot


def copy_into(root: Path, path: Path, source_root: Path = Path("/")) -> None:
    """`path` of this machine (found under `source_root`, a copy of its files) to the same place in the image (a
    tree, a file or a link)."""
    target = root / path.relative_to("/")
    path = source_root / path.relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        target.unlink(missing_ok=True)
        target.symlink_to(path.readlink())
    elif path.is_dir():
        shutil.copytree(path, target, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(path, target)


def install_tool(root: Path) -> None:
    """The tool as this session installed it, at the same path in the image (its python3 is the same
    bookworm 3.11), and the command where install.sh puts it."""
    venv = Path(sys.prefix)
    copy_into(root, venv)
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/local/bin/rdna1-kmgr").unlink(missing_ok=True)
    (root / "usr/local/bin/rdna1-kmgr").symlink_to(venv / "bin/rdna1-kmgr")


def require_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("a whole-system image needs root (loop devices, mount, chroot)")
    missing = [t for t in ("debootstrap", "qemu-system-x86_64", "losetup", "mkfs.ext4") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"a whole-system image needs {', '.join(missing)} (install.sh --test installs them)")


def new_system(base: Path, tmp: Path, kind: Kind = BIOS) -> System:
    """A fresh sparse copy of a base image, in `tmp`: changed by the tests, thrown away with `tmp`. A UEFI
    system gets its own copy of OVMF's variable store too (its Secure Boot keys and MOK list)."""
    copy = tmp / "disk.img"
    _run(["cp", "--sparse=always", str(base), str(copy)])
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    firmware = None
    if kind.uefi:
        shutil.copy(OVMF_VARS, tmp / "OVMF_VARS.fd")
        firmware = Firmware(OVMF_CODE, tmp / "OVMF_VARS.fd")
    return System(copy, logs, kind, firmware)


@pytest.fixture(scope="session", autouse=True)
def _whole_system_disks_go(tmp_path_factory) -> Iterator[None]:
    """Each story's system is a copy of a base image, gigabytes once used (Debian 13's, with two kernels built,
    8 GB); pytest keeps the last three sessions' folders. The copies go when the session ends; the logs stay."""
    yield
    for disk in tmp_path_factory.getbasetemp().glob("*/disk.img"):
        disk.unlink()


@pytest.fixture(scope="session")
def wholesystem_image_61(kernel_61) -> Path:
    """The cached base image with Debian's current 6.1 kernel, the one `built_module_61` builds for. Copy it
    with `new_system` before booting: tests change what they boot. It needs only the kernel's name, not its
    headers on this host: a test in the second lane installs nothing here (tests/second_lane.py)."""
    require_tools()
    return base_image(kernel_61)


def require_uefi() -> None:
    require_tools()
    missing = [str(p) for p in (OVMF_CODE, OVMF_VARS) if not p.is_file()]
    missing += [t for t in ("mkfs.vfat",) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"a UEFI Secure Boot image needs {', '.join(missing)} (install.sh --test installs them)")


@pytest.fixture(scope="session")
def wholesystem_uefi_sb_image_61(headers_61) -> Path:
    """The cached UEFI Secure Boot image (GPT, ESP, shim, signed GRUB and kernel) with Debian's current 6.1
    kernel. Copy it with `new_system(image, tmp, UEFI_SB)` before booting."""
    require_uefi()
    return uefi_sb_image(headers_61)


def trixie_kernel() -> str:
    """The kernel release trixie-security's linux-headers-amd64 points to today (6.12.x+deb13-amd64), asked
    through a private apt state in the test cache; skipped with the reason when the archive has none."""
    from conftest import _using_test_cache

    from rdna1_kmgr.core.errors import KmgrError
    from rdna1_kmgr.source import debian_archive

    with _using_test_cache():
        try:
            return debian_archive.current_kernel_abi("trixie-security")
        except KmgrError as err:
            pytest.skip(f"the archive names no current trixie kernel: {err}")


@pytest.fixture(scope="session")
def wholesystem_image_trixie() -> tuple[Path, str]:
    """(image, kernel): the cached Debian 13 base image with trixie's current kernel (trixie-security's
    linux-image-amd64), GRUB, and the tool installed by the README's ./install.sh in a chroot (trixie's Python
    3.13, dkms, initramfs-tools). Copy it with `new_system` before changing it."""
    require_tools()
    kernel = trixie_kernel()
    return release_image(TRIXIE, kernel), kernel


@pytest.fixture(scope="session")
def wholesystem_uefi_sb_image_trixie() -> tuple[Path, str]:
    """(image, kernel): the Debian 13 image's UEFI Secure Boot kind (GPT, ESP, trixie's shim, signed GRUB and
    signed kernel), made from `wholesystem_image_trixie`'s base. Copy it with `new_system(image, tmp, UEFI_SB)`."""
    require_uefi()
    kernel = trixie_kernel()
    return uefi_sb_image(kernel, TRIXIE), kernel
