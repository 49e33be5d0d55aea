"""An install SIGKILLed inside its DKMS or initramfs step leaves nothing it started running, and rollback then
puts the system back bit for bit (issue 21's second defect).

Real tools on scratch ground: real `dkms install` into the stand-in amdgpu's scratch DKMS trees and a scratch
root (test_module_install's fixtures), and the real update-initramfs with its real mkinitramfs, cpio and zstd
writing into the scratch root's boot folder (`-b`). mkinitramfs reads the machine's /lib/modules/KREL (it has
no other source of modules) and nothing else of the machine's is written: TMPDIR points its temporary files
into the scratch folder, where none may be left. The runs are killed before update-initramfs could
finish, so its post-update hooks never run.

The kill points are events seen in /proc (a program or its child running, the half-written image), not
times. On the event the program's whole session is frozen (SIGSTOP), the event checked again, and only then
the tool is SIGKILLed: the kill lands exactly there however fast the machine is. Nothing else resumes the
frozen programs: the keeper's SIGTERM comes with a SIGCONT.
"""

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from install_checks import ensure_image_installed, purge_image, tree_digest
from install_system import _new_system, fake_tools, pristine  # noqa: F401 (fixtures)

# real dkms, apt/dpkg, a CPU PyTorch or killed process trees on fixtures: seconds each, out of the fast tier
pytestmark = pytest.mark.system

STOPPED_WITHIN = 60  # seconds: the keeper's grace is 10 s; this only bounds a failing test


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    session: int
    state: str
    start: int
    argv: tuple[str, ...]

    def runs(self, name: str) -> bool:
        """The program `name`, or a shell running the script `name`."""
        return any(Path(arg).name == name for arg in self.argv[:2])

    @property
    def is_keeper(self) -> bool:
        return any(Path(arg).name == "keeper.py" for arg in self.argv[:4])


def processes() -> dict[int, Proc]:
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = Proc(
            int(entry.name),
            int(fields[1]),
            int(fields[3]),
            fields[0],
            int(fields[19]),
            tuple(a.decode(errors="replace") for a in argv if a),
        )
    return found


def descendants(root: int) -> list[Proc]:
    table = processes()
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return [p for p in found if p.state not in "ZX"]


def alive(procs: list[Proc]) -> list[Proc]:
    table = processes()
    return [p for p in procs if p.pid in table and table[p.pid].start == p.start and table[p.pid].state not in "ZX"]


# Kill points: given the tool's live descendants and the scratch system, the process whose session to freeze.


def dkms_running(tree, fs):
    return next((p for p in tree if p.runs("dkms") and "install" in p.argv and "--force" in p.argv), None)


def dkms_child_running(tree, fs):
    dkms = dkms_running(tree, fs)
    return next((p for p in tree if dkms and p.ppid == dkms.pid), None)


def update_initramfs_running(tree, fs):
    return next((p for p in tree if p.runs("update-initramfs")), None)


def mkinitramfs_running(tree, fs):
    """mkinitramfs past its set-up: its four working paths made, no mktemp of its own still running. Before that
    a TERM can land between a mktemp that made its file and the assignment that names it to the clean-up trap:
    a window of mkinitramfs's own (Debian 12's initramfs-tools 0.142), not one the tool can close."""
    mkinitramfs = next((p for p in tree if p.runs("mkinitramfs")), None)
    if mkinitramfs is None or any(p.runs("mktemp") for p in tree) or len(mkinitramfs_files(fs)) < 4:
        return None
    return mkinitramfs


def image_half_written(tree, fs):
    new = fs.root / "boot" / f"initrd.img-{fs.kernel}.new"
    writer = next((p for p in tree if p.runs("cpio") or p.runs("zstd")), None)
    return writer if writer and new.exists() and new.stat().st_size > 0 else None


@pytest.fixture(scope="module")
def kernel_image(pristine, tmp_path_factory):  # noqa: F811
    """The scratch system's kernel with its image package installed, once for this module: the real mkinitramfs
    reads the machine's /boot/config-KREL and /lib/modules/KREL, which only the image brings (a fresh machine
    has the headers alone). Purged again when the module is done if it was installed here."""
    installed_here = ensure_image_installed(pristine.kernel)
    yield pristine.kernel
    if installed_here:
        purge_image(pristine.kernel, tmp_path_factory.mktemp("purge"))


@pytest.fixture
def real_initramfs_system(tmp_path, monkeypatch, pristine, fake_tools, kernel_image):  # noqa: F811
    """test_module_install's scratch system, with the real update-initramfs on PATH instead of its double, and
    TMPDIR in the scratch folder."""
    fs = _new_system(tmp_path, monkeypatch, pristine, fake_tools)  # its image made by the double: any bytes do
    fs.write_verdict()
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    path = os.environ["PATH"].replace(f"{fake_tools}:", "")
    fs.env.update(PATH=path, TMPDIR=str(tmp))
    monkeypatch.setenv("PATH", path)
    return fs


def touched(fs) -> dict:
    """Everything an install touches, byte for byte: the kernel's modules, modprobe.d, /boot, the DKMS trees."""
    trees = fs.pristine.trees
    return {
        "modules": tree_digest(fs.root / "lib/modules" / fs.kernel),
        "modprobe.d": tree_digest(fs.root / "etc/modprobe.d"),
        "boot": tree_digest(fs.root / "boot"),
        "dkms source": tree_digest(trees.source),
        "dkms tree": tree_digest(trees.dkms),
    }


def kill_at(fs, point, kill_keeper: bool = False) -> tuple[int, list[Proc]]:
    """Start an install, SIGKILL it at `point` (with its keeper first when asked); its pid, and what it had
    started then."""
    tool = fs.popen("install", "--kernel", fs.kernel, "--yes", *fs.cert_args)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert tool.poll() is None, f"the install ended before {point.__name__}: {tool.communicate()}"
            target = point(descendants(tool.pid), fs)
            if target is None:
                time.sleep(0.01)
                continue
            os.killpg(target.session, signal.SIGSTOP)
            tree = descendants(tool.pid)
            if point(tree, fs) is not None and alive([target]):
                break
            os.killpg(target.session, signal.SIGCONT)  # it ended between the two looks: the next one
        else:
            pytest.fail(f"the install never reached {point.__name__}")
        if kill_keeper:
            (keeper_proc,) = [p for p in tree if p.ppid == tool.pid and p.is_keeper]
            os.kill(keeper_proc.pid, signal.SIGKILL)
        os.kill(tool.pid, signal.SIGKILL)
    finally:
        tool.kill()
        tool.communicate()
    if kill_keeper:
        for proc in tree:  # without a keeper nothing else resumes them: as if never frozen
            os.kill(proc.pid, signal.SIGCONT)
    return tool.pid, tree


def wait_until_gone(procs: list[Proc]) -> list[Proc]:
    deadline = time.monotonic() + STOPPED_WITHIN
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(procs)


def mkinitramfs_files(fs) -> list[Path]:
    return sorted(Path(fs.env["TMPDIR"]).glob("mkinitramfs*"))


def recorded_sessions(fs) -> list[int]:
    path = fs.state / "journal" / fs.kernel / "journal.jsonl"
    return [r["session"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "program"]


POINTS = [dkms_running, dkms_child_running, update_initramfs_running, mkinitramfs_running, image_half_written]


@pytest.mark.parametrize("point", POINTS, ids=[p.__name__ for p in POINTS])
def test_a_killed_install_leaves_nothing_running_and_rollback_restores_every_byte(real_initramfs_system, point):
    fs = real_initramfs_system
    before = touched(fs)
    tool, started = kill_at(fs, point)
    programs = [p for p in started if p.ppid == tool and not p.is_keeper]
    assert programs, "the install had started nothing"
    assert wait_until_gone(started) == []  # the keeper among them: it too is gone once its work is done
    sessions = set(recorded_sessions(fs))
    assert {p.session for p in programs} <= sessions  # each in the journal, by the session it leads
    assert [p for p in processes().values() if p.session in sessions and p.state not in "ZX"] == []
    # TERM before KILL, and a reader for their pipes: mkinitramfs removed its working files on its way out. (dkms
    # may leave its tmp.* folder: it sets its trap only after mktemp, a window of its own.)
    assert mkinitramfs_files(fs) == []

    proc = fs.rollback("--keep-build")
    assert proc.returncode == 0, proc.stderr
    assert "left running by an earlier run" not in proc.stderr  # the keeper had stopped them already
    assert touched(fs) == before


def test_with_its_keeper_killed_too_the_next_run_stops_what_the_journal_names(real_initramfs_system):
    """The net under the net: the keeper SIGKILLed with the tool. update-initramfs dies of its parent death
    signal; mkinitramfs, its child, runs on, and would write the image after rollback restored it."""
    fs = real_initramfs_system
    before = touched(fs)
    _, started = kill_at(fs, mkinitramfs_running, kill_keeper=True)
    time.sleep(0.5)  # not a speed assumption: mkinitramfs runs for tens of seconds; this only lets it resume
    left = alive(started)
    assert any(p.runs("mkinitramfs") for p in left), left

    proc = fs.rollback("--keep-build")
    assert proc.returncode == 0, proc.stderr
    assert "left running by an earlier run that was killed" in proc.stderr
    assert alive(started) == []
    assert touched(fs) == before
    # Not checked here: mkinitramfs's working files. With tool and keeper gone its pipes have no reader, and the
    # SIGTERM that stops it makes it write its failure, die of SIGPIPE and skip its clean-up trap.
