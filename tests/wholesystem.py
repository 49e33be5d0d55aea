"""A whole Debian 12 system in QEMU: boot loader, initramfs, systemd and a kernel of its own, on a disk image.

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
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import persistent_cache_root

RECIPE = 2  # bump when the image recipe changes: a new cached image is built
DISK_SIZE = 6 << 30  # sparse; ~1.6 GB used
PART_OFFSET = 1 << 20  # the partition starts at 1 MiB (sector 2048), room for GRUB's core image
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


def _mbr(disk_size: int) -> bytes:
    """A DOS partition table with one bootable Linux partition from 1 MiB to the end."""
    start = PART_OFFSET // 512
    count = disk_size // 512 - start
    entry = struct.pack("<B3sB3sII", 0x80, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff", start, count)
    return b"\0" * 446 + entry + b"\0" * 48 + b"\x55\xaa"


@contextlib.contextmanager
def mounted(image: Path) -> Iterator[Path]:
    """The image's file system mounted on a scratch folder (a loop device at the partition's offset)."""
    loop = _run(["losetup", "--find", "--show", "--offset", str(PART_OFFSET), str(image)]).stdout.strip()
    where = Path(f"/run/wholesystem-{os.getpid()}-{Path(loop).name}")
    where.mkdir(parents=True, exist_ok=True)
    try:
        _run(["mount", loop, str(where)])
        try:
            yield where
        finally:
            subprocess.run(["sync", "-f", str(where)])
            _run(["umount", str(where)])
    finally:
        subprocess.run(["losetup", "-d", loop])
        where.rmdir()


@contextlib.contextmanager
def _chroot_mounts(root: Path) -> Iterator[None]:
    done = []
    try:
        for fs, target, opts in (("proc", "proc", []), ("sysfs", "sys", []), ("/dev", "dev", ["--bind"])):
            argv = ["mount", *opts, fs, str(root / target)] if opts else ["mount", "-t", fs, fs, str(root / target)]
            _run(argv)
            done.append(root / target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-l", str(target)])


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
    image: Path, log: Path, timeout: float, kill_on: str | None = None, kernel: tuple[Path, Path, str] | None = None
) -> Boot:
    """Boot the disk under TCG; destroy the VM when the console shows `kill_on`, or at `timeout`."""
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
        "-serial",
        f"file:{log}",
        "-monitor",
        "none",
        "-vga",
        "none",
        "-drive",
        f"file={image},format=raw,if=virtio,cache=writeback",
    ]
    if kernel:
        argv += ["-kernel", str(kernel[0]), "-initrd", str(kernel[1]), "-append", kernel[2]]
    log.write_bytes(b"")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    killed = timed_out = False
    try:
        while proc.poll() is None:
            if kill_on and kill_on in log.read_text(errors="replace"):
                killed = True
                break
            if time.monotonic() - started > timeout:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # a power cut: nothing in the guest gets to run
        proc.wait()
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    console = log.read_text(errors="replace")
    if proc.returncode not in (0, -signal.SIGKILL) and not (killed or timed_out):
        raise RuntimeError(f"qemu failed ({proc.returncode}): {output[-2000:]}")
    return Boot(console, time.monotonic() - started, killed, timed_out)


def _build_base(image: Path, kernel: str, work: Path) -> None:
    sources = debian_sources()
    mirror = next((uri for uri, suites in sources if "bookworm" in suites), None)
    if mirror is None:
        pytest.skip("the machine's apt sources list no Debian bookworm archive to debootstrap from")
    with open(image, "wb") as disk:
        disk.truncate(DISK_SIZE)
        disk.write(_mbr(DISK_SIZE))
    loop = _run(["losetup", "--find", "--show", "--offset", str(PART_OFFSET), str(image)]).stdout.strip()
    try:
        _run(["mkfs.ext4", "-q", "-L", "wholesystem", loop])
    finally:
        subprocess.run(["losetup", "-d", loop])
    with mounted(image) as root:
        _run(
            ["debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(root), mirror],
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
        shutil.copy(root / f"boot/vmlinuz-{kernel}", work / "vmlinuz")
        shutil.copy(root / f"boot/initrd.img-{kernel}", work / "initrd")
    # First boot, kernel given directly: the boot loader goes onto the disk from inside (the host has no GRUB).
    boot = qemu_boot(
        image,
        work / "firstboot.log",
        timeout=900,
        kernel=(work / "vmlinuz", work / "initrd", "root=/dev/vda1 ro console=ttyS0"),
    )
    result = read_step(image)
    if result[0] != 0:
        raise RuntimeError(
            f"grub-install in the first boot failed ({result[0]}): {result[1][-2000:]}\n" f"{boot.tail()}"
        )


def facts(out: str) -> dict[str, str]:
    """The `FACT name=value` lines a step printed about the boot it ran in."""
    found = {}
    for line in out.splitlines():
        if line.startswith("FACT "):
            key, _, value = line[5:].partition("=")
            found[key] = value.strip()
    return found


def read_step(image: Path) -> tuple[int | None, str]:
    with mounted(image) as root:
        rc_file, out_file = root / STEP_DIR / "step.rc", root / STEP_DIR / "step.out"
        rc = int(rc_file.read_text()) if rc_file.is_file() else None
        out = out_file.read_text(errors="replace") if out_file.is_file() else ""
        for name in ("step.rc", "step.out", "step.run"):
            (root / STEP_DIR / name).unlink(missing_ok=True)
    return rc, out


def base_image(kernel: str) -> Path:
    """The cached base image for `kernel` (built the first time; several sessions wait for one build)."""
    folder = persistent_cache_root() / "wholesystem"
    folder.mkdir(parents=True, exist_ok=True)
    image = folder / f"debian12-{kernel}-r{RECIPE}.img"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image.is_file():
            return image
        work = folder / f".build-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        partial = work / image.name
        started = time.monotonic()
        try:
            _build_base(partial, kernel, work)
            os.replace(partial, image)
            for older in folder.glob(f"debian12-{kernel}-r*.img"):  # earlier recipes: 1.6 GB each
                if older != image:
                    older.unlink()
            (folder / f"{image.name}.seconds").write_text(f"{time.monotonic() - started:.0f}\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return image


class System:
    """One session's copy of the base image: files put in while it is off, boots with a step each."""

    def __init__(self, image: Path, logs: Path):
        self.image = image
        self.logs = logs
        self.boots: list[Boot] = []

    @contextlib.contextmanager
    def files(self) -> Iterator[Path]:
        """The powered-off system's root file system, mounted read-write."""
        with mounted(self.image) as root:
            yield root

    def boot(self, step: str | None, timeout: float = 900, kill_on: str | None = None) -> Boot:
        """Boot through GRUB; `step` (shell) runs once the multi-user target is reached, then power-off."""
        if step is not None:
            with self.files() as root:
                (root / STEP_DIR / "step.sh").write_text(step)
        log = self.logs / f"boot-{len(self.boots) + 1}.log"
        boot = qemu_boot(self.image, log, timeout, kill_on=kill_on)
        self.boots.append(boot)
        if step is not None and not boot.killed:
            boot.step_rc, boot.step_out = read_step(self.image)
            log.with_suffix(".step").write_text(f"{boot.step_out}\n(exit status {boot.step_rc})\n")
        return boot


def copy_into(root: Path, path: Path) -> None:
    """`path` of this machine to the same place in the image (a tree, a file or a link)."""
    target = root / path.relative_to("/")
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
    bookworm 3.11), and the command in /usr/local/sbin."""
    venv = Path(sys.prefix)
    copy_into(root, venv)
    (root / "usr/local/sbin").mkdir(parents=True, exist_ok=True)
    (root / "usr/local/sbin/rdna1-kmgr").unlink(missing_ok=True)
    (root / "usr/local/sbin/rdna1-kmgr").symlink_to(venv / "bin/rdna1-kmgr")


def require_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("a whole-system image needs root (loop devices, mount, chroot)")
    missing = [t for t in ("debootstrap", "qemu-system-x86_64", "losetup", "mkfs.ext4") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"a whole-system image needs {', '.join(missing)} (install.sh --test installs them)")


def new_system(base: Path, tmp: Path) -> System:
    """A fresh sparse copy of a base image, in `tmp`: changed by the tests, thrown away with `tmp`."""
    copy = tmp / "disk.img"
    _run(["cp", "--sparse=always", str(base), str(copy)])
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    return System(copy, logs)


@pytest.fixture(scope="session")
def wholesystem_image_61(headers_61) -> Path:
    """The cached base image with Debian's current 6.1 kernel, the one `built_module_61` builds for. Copy it
    with `new_system` before booting: tests change what they boot."""
    require_tools()
    return base_image(headers_61)
