"""A power cut at every flush of one recorded run, checked on the host (issue 52's crash-consistency test).

A whole-system guest (tests/wholesystem.py) runs `rdna1-kmgr install` with its disk behind QEMU's blklogwrites
driver, so every write and flush it makes is logged (tests/log_writes.py reads and replays the log). The guest
writes a label to one sector of its own disk before and after the install (`mark`): the sector just before the
root partition, which nothing else uses (GRUB's core image ends some 60 sectors into the disk's first MiB). Those
writes are in the log too, so the install's window is known in log entries.

Replaying the log onto a copy of the disk the run started from rebuilds it as it stood at each flush: what a
power cut there would have left. Every such point is a disk image, made instantly as a reflink copy on an XFS
file system of the test's own (`ReflinkArea`, a loop-mounted sparse file): copies share their blocks, so one
pass over the log snapshots every point, and checking a point (its journal replayed by the mount, a rollback
run on it) changes only its own copy.

At each point, first a survey (`survey`, a second or so):

    GRUB's view      the file system mounted read-only without replaying its journal (`noload`), which is how
                     GRUB's ext4 reader sees it at the next power-on: /boot/grub/grubenv is a well-formed
                     environment block (its documented format: 1024 bytes, the header line, name=value lines,
                     `#` to the end)
    the kernel's     mounted read-write, so ext4 replays its journal as the next boot's kernel would; grubenv
                     is well-formed there too, and the tool's journal is read line by line (kind and step of
                     each complete line)

then, at the points chosen (`choose`), the rollback check (`RollbackCheck`, ~10-20 s):

    rollback         `rdna1-kmgr rollback --kernel KREL --keep-build --yes` in a chroot of the point's disk (the
                     DKMS build was there before the install: `build` made it): it succeeds, or says there is
                     nothing to roll back (before the journal's first record)
    every file       /boot, /etc, /usr/local/lib, /var/lib/dkms and the kernel's /lib/modules tree are then
                     what they were when the install started (the disk at the first mark), file by file: type,
                     mode, owner, sha256 (the distribution's own modules under kernel/: size and mtime)
    e2fsck           `e2fsck -fn` then finds the file system clean (`fsck_problem`)

with one allowance: grub.cfg is what update-grub made, either the one from before the install or the one
update-grub makes in such a chroot from the files before the install (tests/wholesystem.py: a chroot's
update-grub is told the root device, so its linux lines say root=/dev/vda1, not root=UUID=).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from log_writes import Log, Replayer, flush_points, sparse_copy
from wholesystem import System, _run, loop_device, mounted

MARK_SECTOR = 2047  # the last 512-byte sector before the root partition (PART_OFFSET, 1 MiB)
MARK_PREFIX = b"RDNA1-KMGR-TEST-MARK "
STATE_DIR = "var/lib/rdna1-kmgr"
GRUBENV = "boot/grub/grubenv"
GRUBENV_HEADER = b"# GRUB Environment Block\n"
GRUBENV_SIZE = 1024

# What install and rollback may change, compared file by file with the disk before the install
WATCHED = ("boot", "etc", "usr/local/lib", "var/lib/dkms")
# Written by System.entered() for the chroot itself, gone when it is left
CHROOT_ONLY = {"etc/default/grub.d/zz-wholesystem-chroot.cfg"}
GRUB_CFG = "boot/grub/grub.cfg"


def mark(label: str) -> str:
    """Shell for the guest: `label` written to MARK_SECTOR past the page cache, then flushed to the disk."""
    assert label.replace("-", "").isalnum(), label
    text = (MARK_PREFIX + label.encode()).ljust(512, b" ").decode()
    return (
        f"printf '%s' '{text}' | dd of=/dev/vda bs=512 seek={MARK_SECTOR} count=1 "
        "oflag=direct conv=notrunc,fsync status=none\n"
    )


def marks(log: Log) -> dict[str, int]:
    """label -> the index of the log entry that wrote it."""
    found = {}
    sectors_per_mark = 512 // log.sector_size or 1
    with log.path.open("rb") as handle:
        for entry in log.entries:
            if entry.sector * log.sector_size != MARK_SECTOR * 512 or entry.nr_sectors != sectors_per_mark:
                continue
            data = os.pread(handle.fileno(), 512, entry.data_offset)
            if data.startswith(MARK_PREFIX):
                found[data[len(MARK_PREFIX) :].decode().strip()] = entry.index
    return found


def grubenv_problem(data: bytes | None) -> str | None:
    """Why `data` is not a GRUB environment block as GRUB documents it (None: it is one): 1024 bytes, the header
    line, then name=value lines (or comments: grub-editenv writes one, its warning), then `#` to the end."""
    if data is None:
        return "missing"
    if len(data) != GRUBENV_SIZE:
        return f"{len(data)} bytes, not {GRUBENV_SIZE}"
    if not data.startswith(GRUBENV_HEADER):
        return f"starts {data[:25]!r}, not the block's header"
    variables = data[len(GRUBENV_HEADER) :].rstrip(b"#")
    if variables and not variables.endswith(b"\n"):
        return "its padding is not all '#' after the last variable's newline"
    for line in variables.splitlines():
        if line.startswith(b"#"):
            continue
        name, equals, _ = line.partition(b"=")
        if not equals or not name or not line.isascii() or not line.decode().isprintable():
            return f"line {line[:40]!r} is not name=value"
    return None


def grubenv_variables(data: bytes) -> dict[str, str]:
    lines = data[len(GRUBENV_HEADER) :].rstrip(b"#").decode().splitlines()
    return dict(line.split("=", 1) for line in lines if not line.startswith("#"))


class ReflinkArea:
    """An XFS file system with reflink in a sparse file, loop-mounted on `path`: `snapshot` copies a disk image in
    it instantly, its blocks shared until one of the copies writes them."""

    def __init__(self, folder: Path, size: int) -> None:
        self.backing = folder / "reflink-area.xfs"
        self.path = folder / "reflink-area"
        with open(self.backing, "wb") as handle:
            handle.truncate(size)
        _run(["mkfs.xfs", "-q", "-m", "reflink=1", str(self.backing)])
        self.path.mkdir()
        _run(["mount", "-o", "loop", str(self.backing), str(self.path)])

    def snapshot(self, image: Path, name: str) -> Path:
        copy = self.path / name
        self.copy(image, copy)
        return copy

    @staticmethod
    def copy(image: Path, copy: Path) -> None:
        _run(["cp", "--reflink=always", str(image), str(copy)])

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], capture_output=True)
        self.path.rmdir()
        self.backing.unlink()


def snapshot_points(log: Log, base: Path, area: ReflinkArea, wanted: set[int], prefix: str = "") -> dict[int, Path]:
    """One pass over the log from a copy of `base`: a snapshot of the disk at each crash point in `wanted`."""
    replayed = area.path / f"{prefix}replayed.img"
    area.copy(base, replayed)
    found = {}
    with Replayer(log, replayed) as replayer:
        for point in sorted(wanted):
            replayer.advance_through(point)
            found[point] = area.snapshot(replayed, f"{prefix}point-{point}.img")
    replayed.unlink()
    return found


def replay_mismatch(log: Log, start: Path, end: Path, scratch: Path) -> str | None:
    """None when every entry of `log` replayed onto a copy of `start` (made at `scratch`, then removed) gives `end`
    byte for byte; otherwise where they first differ, as cmp says it."""
    sparse_copy(start, scratch)
    try:
        with Replayer(log, scratch) as replayer:
            replayer.advance_through(len(log.entries) - 1)
        compared = subprocess.run(["cmp", str(scratch), str(end)], capture_output=True, text=True)
    finally:
        scratch.unlink()
    return None if compared.returncode == 0 else (compared.stdout + compared.stderr).strip()


@dataclass(frozen=True)
class Survey:
    """What a power cut at one point left, read before anything runs on it."""

    point: int
    mounts: bool
    grub_view: str | None  # grubenv_problem as GRUB's reader finds it (no journal replay)
    kernel_view: str | None  # the same once the kernel replayed the journal
    journal: tuple[str, ...]  # "kind step" of each complete line of the kernel's journal ((): no journal)
    torn_line: bool  # the journal ends in a line without its newline
    grub_env: tuple[tuple[str, str], ...]  # grubenv's variables as GRUB reads them
    kernel_env: tuple[tuple[str, str], ...]  # and once the journal is replayed

    @property
    def problems(self) -> list[str]:
        problems = []
        if not self.mounts:
            problems.append("the root file system does not mount")
        if self.grub_view:
            problems.append(f"grubenv as GRUB reads it: {self.grub_view}")
        if self.kernel_view:
            problems.append(f"grubenv: {self.kernel_view}")
        return problems


def survey(point: int, image: Path, kernel: str) -> Survey:
    with contextlib.ExitStack() as stack:
        try:
            root = stack.enter_context(mounted(image, readonly=True, options="ro,noload"))
        except RuntimeError:  # it does not mount
            grub_view, grub_env = "the file system cannot be read", ()
        else:
            data = _read(root / GRUBENV)
            grub_view = grubenv_problem(data)
            grub_env = _variables(data) if data and not grub_view else ()
    with contextlib.ExitStack() as stack:
        try:
            root = stack.enter_context(mounted(image))
        except RuntimeError:
            return Survey(point, False, grub_view, None, (), False, grub_env, ())
        data = _read(root / GRUBENV)
        kernel_view = grubenv_problem(data)
        kernel_env = _variables(data) if data and not kernel_view else ()
        journal_file = root / STATE_DIR / "journal" / kernel / "journal.jsonl"
        raw = journal_file.read_bytes() if journal_file.is_file() else b""
        lines = raw.split(b"\n")
        complete, torn = lines[:-1], bool(lines[-1])
        journal = tuple(_record_name(line) for line in complete)
    return Survey(point, True, grub_view, kernel_view, journal, torn, grub_env, kernel_env)


def _variables(data: bytes) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(grubenv_variables(data).items()))


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def _record_name(line: bytes) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        return "unparsable"
    return f"{record.get('kind')} {record.get('step', '')}".strip()


def choose(surveys: list[Survey], window: tuple[int, int], interior: int) -> list[Survey]:
    """The points to roll back: in the run's window, the first and the last of each journal state (a record just
    on disk; the step it protects as far as it got before the next record) and up to `interior` more of each,
    evenly spread (a program's output part written); outside it, the first and the last point."""
    inside = [s for s in surveys if window[0] <= s.point <= window[1]]
    outside = [s for s in surveys if not window[0] <= s.point <= window[1]]
    chosen = {s.point: s for s in (outside[:1] + outside[-1:])}
    runs: list[list[Survey]] = []
    for s in inside:
        if runs and runs[-1][-1].journal == s.journal:
            runs[-1].append(s)
        else:
            runs.append([s])
    for run in runs:
        middle = run[1:-1]
        step = max(1, len(middle) // (interior + 1)) if interior else 0
        picked = [run[0], run[-1]] + (middle[step - 1 :: step][:interior] if step else [])
        chosen.update({s.point: s for s in picked})
    return [chosen[p] for p in sorted(chosen)]


def tree_state(root: Path, kernel: str) -> dict[str, str]:
    """Every path under WATCHED and /lib/modules/KREL: its type, mode, owner and content (sha256; a link's
    target; the distribution's own modules, under kernel/, by size and mtime)."""
    found = {}
    stock = f"lib/modules/{kernel}/kernel/"
    for top in (*WATCHED, f"lib/modules/{kernel}"):
        for folder, dirs, files in os.walk(root / top):
            for name in dirs + files:
                path = Path(folder) / name
                rel = str(path.relative_to(root))
                if rel in CHROOT_ONLY:
                    continue
                info = path.lstat()
                owner = f"{stat.filemode(info.st_mode)} {info.st_uid}:{info.st_gid}"
                if stat.S_ISLNK(info.st_mode):
                    found[rel] = f"{owner} -> {os.readlink(path)}"
                elif stat.S_ISREG(info.st_mode):
                    content = (
                        f"{info.st_size} bytes, mtime {info.st_mtime_ns}"
                        if rel.startswith(stock)
                        else hashlib.sha256(path.read_bytes()).hexdigest()
                    )
                    found[rel] = f"{owner} {content}"
                else:
                    found[rel] = owner
    return found


def differences(before: dict[str, str], after: dict[str, str], grub_cfgs: set[str]) -> list[str]:
    problems = []
    for path in sorted(set(before) | set(after)):
        if path == GRUB_CFG and after.get(path) in grub_cfgs:
            continue
        if before.get(path) != after.get(path):
            problems.append(f"{path}: {before.get(path, 'absent')} -> {after.get(path, 'absent')}")
    return problems


@dataclass(frozen=True)
class RollbackCheck:
    """`rollback` run on the disk of one point, and what differs from the disk before the install."""

    point: int
    journal: tuple[str, ...]
    returncode: int
    output: str
    differs: tuple[str, ...]
    fsck: str | None  # fsck_problem once rolled back

    @property
    def problems(self) -> list[str]:
        problems = [f"e2fsck after rollback: {self.fsck}"] if self.fsck else []
        if self.returncode != 0:
            lines = self.output.strip().splitlines()
            return problems + [f"rollback failed ({self.returncode}): {lines[-1] if lines else 'no output'}"]
        return problems + [f"after rollback {line}" for line in self.differs[:20]]


def fsck_problem(image: Path) -> str | None:
    """What `e2fsck -fn` finds wrong with the image's root file system (None: it is clean). Run on a file system
    whose journal a mount has replayed and that was then unmounted: -n does not replay it."""
    with loop_device(image, readonly=True) as loop:
        checked = subprocess.run(["e2fsck", "-fn", loop], capture_output=True, text=True)
    if checked.returncode == 0:
        return None
    lines = [line for line in checked.stdout.splitlines() if line and not line.startswith(("Pass ", "e2fsck "))]
    return f"exit status {checked.returncode}: " + " / ".join(lines[:8])


def reference(image: Path, kernel: str, logs: Path) -> tuple[dict[str, str], set[str]]:
    """The disk before the install: its files, and the grub.cfg update-grub makes from them in a chroot."""
    system = System(image, logs)
    with system.files() as root:
        before = tree_state(root, kernel)
    made = system.chroot(["update-grub"], name="reference-update-grub")
    assert made.returncode == 0, made.stderr[-2000:]
    with system.files() as root:
        regenerated = tree_state(root, kernel)[GRUB_CFG]
    return before, {before[GRUB_CFG], regenerated}


def check_rollback(
    survey_: Survey, image: Path, kernel: str, logs: Path, before: dict[str, str], grub_cfgs: set[str], run_name: str
) -> RollbackCheck:
    system = System(image, logs)
    run = system.chroot(
        ["rdna1-kmgr", "rollback", "--kernel", kernel, "--keep-build", "--yes"],
        name=f"rollback-at-{run_name}-{survey_.point}",
    )
    with system.files() as root:
        after = tree_state(root, kernel)
    return RollbackCheck(
        survey_.point,
        survey_.journal,
        run.returncode,
        run.stdout + run.stderr,
        tuple(differences(before, after, grub_cfgs)),
        fsck_problem(image),
    )


def install_window(log: Log) -> tuple[int, int, list[int]]:
    """(first, last) log entries of the run between the marks, and every crash point of the log."""
    found = marks(log)
    missing = {"run-start", "run-end"} - set(found)
    assert not missing, f"the guest's marks {sorted(missing)} are not in the log (found {found})"
    return found["run-start"], found["run-end"], flush_points(log)
