"""A power cut at any flush of `install` or `rollback` leaves a disk that mounts, a journal rollback can trust,
and a machine that boots (issue 52).

A recording boot of a whole Debian 12 system (tests/wholesystem.py) runs `rdna1-kmgr install` in the guest
under TCG, with the boot guard on: dkms, depmod, update-initramfs, update-grub, grub-editenv, all real. QEMU's
blklogwrites driver logs every write and flush the guest makes; tests/power_cut.py rebuilds the disk at each
flush and checks it on the host (its docstring says what is checked and how):

    every point of the run, and the first and last of the boot before it and of the shut-down after it:
        the file system mounts, both with its journal replayed (the next kernel) and without (GRUB's reader);
        grubenv is a well-formed environment block in both views; the tool's journal is a prefix of the one
        the finished run wrote (a line cut short at the end at most): never a line that is not the tool's
    the points rollback is run on (power_cut.choose: the first and the last point of each journal state, so
    every point where one of the tool's records reached the disk and the last before the next one did; and
    INTERIOR more of each): rollback in a chroot puts every file back as it was before the install, and
    e2fsck finds the file system clean
    the whole log: replayed onto the disk as the recorded boot started, it gives the disk that boot left, byte
    for byte (so each point is a state the run really passed through, not one the replay made up)
    one point booted for real, the first after the install's last journal record: the machine comes up with the
    quirks on (the boot guard's trial) and `status` says what the boot shows

`RDNA1_KMGR_TEST_POWER_CUT=all` is the full sweep (issue 52's opt-in tier, for a closing note, run with
RDNA1_KMGR_TEST_ONE_LANE=1): rollback at every point; two more boots (after the initramfs is written, and
after the boot guard's GRUB environment is written, each just before the step's `done`); a second recording,
the next boot (the guard's trial) running `rdna1-kmgr rollback`, checked the same way; and a third on a system
of its own, `followed`: apt installing bookworm-backports' 6.12 kernel and headers on a machine whose 6.1 has
the install and the hooks, so that apt's Post-Invoke hook runs `follow pending` and that installs 6.12's build
(the session's real one, its DKMS trees copied in) journaled. Its checks read 6.12's journal, and its rollback
checks start at that journal's first record: the reference is the disk just before it (apt's own writes
before then are dpkg's, whose crash safety is dpkg's). `RDNA1_KMGR_TEST_POWER_CUT_NO_FSYNC=1` stubs out os.fsync
in the guest's copy of the tool (a .pth file), to show the test finding what a missing fsync does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import power_cut as pc
import pytest
from build_fixtures import MOK_CERT, build_files, copy_build_into
from install_checks import verdict_record
from log_writes import Log, read_log
from wholesystem import (
    STEP_DIR,
    System,
    WriteLog,
    copy_into,
    debian_sources,
    facts,
    install_tool,
    new_system,
    qemu_boot,
    read_step,
)

from rdna1_kmgr.modbuild.prerequisites import BUILD_TOOLS

# In the second lane (tests/second_lane.py): its own image and reflink area; the host's build comes handed over
pytestmark = [pytest.mark.vm, pytest.mark.realbuild, pytest.mark.second_lane]

FULL = os.environ.get("RDNA1_KMGR_TEST_POWER_CUT") == "all"
NO_FSYNC = os.environ.get("RDNA1_KMGR_TEST_POWER_CUT_NO_FSYNC") == "1"
INTERIOR = 0  # rollback checks inside a journal state, besides its first and last point (all of them with FULL)
AREA_SIZE = 32 << 30  # sparse: the base copy (~2 GB) and what the points wrote

BOOT_FACTS = """
echo "FACT cmdline=$(cat /proc/cmdline)"
echo "FACT quirks=$(cat /sys/module/amdgpu/parameters/rdna1_quirks 2>/dev/null || echo none)"
echo "FACT status=$(rdna1-kmgr status --json | tr -d '\\n')"
"""


@dataclass(frozen=True)
class Stage:
    """The system the runs are recorded on, its reflink area, and what the module's tests share."""

    system: System
    area: pc.ReflinkArea
    kernel: str
    mask: str
    say: Callable[[str], None]


@dataclass(frozen=True)
class Recording:
    """One recorded run: its log, its window between the marks, each chosen point's disk and survey."""

    stage: Stage
    name: str
    kernel: str  # whose journal the surveys read and the rollback checks roll back
    log: Log
    window: tuple[int, int]
    snapshots: dict[int, Path]
    surveys: tuple[pc.Survey, ...]
    replay_mismatch: str | None  # power_cut.replay_mismatch: None when the log replayed whole is the disk the run left

    @property
    def inside(self) -> list[pc.Survey]:
        return [s for s in self.surveys if self.window[0] <= s.point <= self.window[1]]


def _say(request) -> Callable[[str], None]:
    """Writes a line to the session's output as it happens (past pytest's capture): the numbers of the run."""
    plugins = request.config.pluginmanager
    terminal, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")

    def say(line: str) -> None:
        if terminal and capture:
            with capture.global_and_fixture_disabled():
                terminal.write_line(f"power cut: {line}")

    return say


@pytest.fixture(scope="module")
def stage(request, built_module_61, wholesystem_image_61, tmp_path_factory) -> Iterator[Stage]:
    if shutil.which("mkfs.xfs") is None:
        pytest.skip(
            "the power-cut test snapshots its disks on XFS: mkfs.xfs is missing (install.sh --test installs it)"
        )
    kernel = built_module_61["kernel"]
    built = Path(built_module_61["files_root"])
    tmp = tmp_path_factory.mktemp("power-cut")
    system = new_system(wholesystem_image_61, tmp)
    with system.files() as root:
        install_tool(root)
        copy_build_into(root, built_module_61)
        if NO_FSYNC:
            site = root / Path(sys.prefix).relative_to("/") / "lib" / f"python3.{sys.version_info.minor}"
            (site / "site-packages/zz-test-no-fsync.pth").write_text("import os; os.fsync = lambda fd: None\n")
    source = build_files(built_module_61)[0]
    manifest = json.loads((built / source.relative_to("/") / "rdna1-manifest.json").read_text())
    area = pc.ReflinkArea(tmp, AREA_SIZE)
    try:
        yield Stage(system, area, kernel, f"0x{manifest['quirks_mask']:x}", _say(request))
    finally:
        area.close()


def record(
    stage: Stage,
    name: str,
    command: str,
    system: System | None = None,
    kernel: str | None = None,
    before: str = "",
    timeout: float = 2400,
) -> Recording:
    """`command` run in a boot of `system` (the stage's) between the marks, recorded; the disk snapshotted and
    surveyed (`kernel`'s journal, the stage's by default) at every crash point between the marks, and at the
    first and last of the boot and of the shutdown. `before` runs first, before the first mark."""
    system = system or stage.system
    kernel = kernel or stage.kernel
    log_path = system.logs / f"{name}-writes.log"
    recorded = WriteLog(log_path, stage.area.path / f"{name}-start.img", stage.area.path / f"{name}-end.img")
    started = time.monotonic()
    boot = system.boot(
        # The step of a boot of any point, in place before the run: writing it into a point's disk on the host
        # would mount it, and the kernel's journal replay would hide what GRUB reads after the cut.
        f"set -e\ncat > /{STEP_DIR}/step.sh <<'STEP'\nset -e\n{BOOT_FACTS}STEP\nsync\n"
        + before
        + pc.mark("run-start")
        + command
        + "\n"
        + pc.mark("run-end"),
        timeout=timeout,
        write_log=recorded,
    )
    assert not boot.timed_out, f"the recording boot did not finish:\n{boot.tail()}"
    assert boot.step_rc == 0, f"{name} failed in the guest ({boot.step_rc}):\n{boot.step_out[-4000:]}"
    log = read_log(log_path)
    start, end, points = pc.install_window(log)
    before = [p for p in points if p < start]
    inside = [p for p in points if start <= p <= end]
    after = [p for p in points if p > end]
    stage.say(
        f"{name} recorded in {time.monotonic() - started:.0f} s: {len(log.entries)} log entries, {len(points)} "
        f"crash points ({len(before)} booting, {len(inside)} in the {name}, {len(after)} shutting down), "
        f"{log_path.stat().st_size >> 20} MiB"
    )
    wanted = set(inside) | set(before[:1] + before[-1:] + after[:1] + after[-1:])
    started = time.monotonic()
    snapshots = pc.snapshot_points(log, recorded.start, stage.area, wanted, prefix=name)
    mismatch = pc.replay_mismatch(log, recorded.start, recorded.end, stage.area.path / f"{name}-replayed.img")
    for path in (recorded.start, recorded.end, log_path):
        path.unlink()  # gigabytes; the snapshots hold what the checks need
    surveys = tuple(survey_copy(stage, point, snapshots[point], kernel) for point in sorted(wanted))
    stage.say(f"{name}: replayed and surveyed {len(surveys)} points in {time.monotonic() - started:.0f} s")
    return Recording(stage, name, kernel, log, (start, end), snapshots, surveys, mismatch)


def survey_copy(stage: Stage, point: int, snapshot: Path, kernel: str) -> pc.Survey:
    """The survey on a copy: its mount replays the journal, and the snapshot must stay as the cut left it (the
    boots and the rollback checks start from it)."""
    copy = stage.area.snapshot(snapshot, "survey.img")
    try:
        return pc.survey(point, copy, kernel)
    finally:
        copy.unlink()


@pytest.fixture(scope="module")
def installed(stage) -> Recording:
    return record(stage, "install", f"rdna1-kmgr install --kernel {stage.kernel} --skip-vm-check --yes")


@pytest.fixture(scope="module")
def rolled_back(stage, installed) -> Recording:
    """The next boot (the boot guard's trial) rolls the install back, recorded the same way."""
    if not FULL:
        pytest.skip("the rollback's recording is in the full sweep (RDNA1_KMGR_TEST_POWER_CUT=all): CI records one run")
    return record(stage, "rollback", f"rdna1-kmgr rollback --kernel {stage.kernel} --keep-build --yes")


@pytest.fixture(scope="module")
def followed(request, stage, built_module_61, wholesystem_image_61, tmp_path_factory) -> Recording:
    """apt installs bookworm-backports' 6.12 kernel on a system whose 6.1 kernel has a finished install, with the
    hooks `rdna1-kmgr hooks install` places: dpkg runs the kernel hooks (follow defer), apt's Post-Invoke hook
    `follow pending`, which installs the 6.12 build journaled. Recorded from apt's start to its end."""
    if not FULL:
        pytest.skip("follow's recording is in the full sweep (RDNA1_KMGR_TEST_POWER_CUT=all): CI records one run")
    built = request.getfixturevalue("built_module_612")
    new = built["kernel"]
    system = new_system(wholesystem_image_61, tmp_path_factory.mktemp("power-cut-follow"))
    with system.files() as root:
        install_tool(root)
        copy_build_into(root, built_module_61)
        copy_build_into(root, built)
        # The pair the builds were signed with: follow verifies the 6.12 build it reuses against it
        copy_into(root, MOK_CERT.with_name("mok.key"))
        # The driver source follow renders, where its fetch finds it (no network in the guest)
        source = Path(built["source"])
        cached = root / "var/cache/rdna1-kmgr/src"
        cached.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, cached / source.name, symlinks=True)
        # The verdict `vm-test` stores for that module (tests/vm proves that part; a VM inside this TCG guest
        # would take an hour): follow's vm-test stage reuses it
        record_file = Path("/", pc.STATE_DIR, "validations", f"{built['sha256']}.json")
        for folder in (record_file.parent.parent, record_file.parent):  # root's alone, as the tool makes them
            (root / folder.relative_to("/")).mkdir(mode=0o700)
        stored = replace(verdict_record(built["sha256"], new), record=str(record_file))
        (root / record_file.relative_to("/")).write_text(json.dumps(stored.to_json(), indent=2, sort_keys=True))
        mirror = next(uri for uri, suites in debian_sources() if "bookworm" in suites)
        (root / "etc/apt/sources.list.d/backports.list").write_text(f"deb {mirror} bookworm-backports main\n")
    apt = ["apt-get", "install", "-y", "--no-install-recommends", "-t", "bookworm-backports"]
    packages = [f"linux-image-{new}", f"linux-headers-{new}"]
    for name, argv in (
        ("apt-update", ["apt-get", "update"]),
        # What `rdna1-kmgr build` had installed on a machine where follow builds: follow never installs it
        ("build-tools", [*apt[:4], *BUILD_TOOLS]),
        ("apt-download", [*apt, "--download-only", *packages]),
        ("hooks-install", ["rdna1-kmgr", "hooks", "install"]),
        # --confirm-after 0: the boot that records confirms its trial at once (the wait below), so the guard's
        # timer writes nothing while apt runs
        (
            "install-61",
            ["rdna1-kmgr", "install", "--kernel", stage.kernel, "--skip-vm-check", "--yes", "--confirm-after", "0"],
        ),
    ):
        done = system.chroot(argv, name=f"follow-{name}")
        assert done.returncode == 0, f"{' '.join(argv)} in the chroot: {done.stderr[-2000:]}"
    confirmed = (
        "for i in $(seq 600); do grub-editenv /boot/grub/grubenv list | grep -qx rdna1_kmgr=confirmed && break;"
        " sleep 1; done\ngrub-editenv /boot/grub/grubenv list | grep -qx rdna1_kmgr=confirmed\n"
    )
    command = (
        f"DEBIAN_FRONTEND=noninteractive {' '.join(apt)} --no-download {' '.join(packages)} > /root/apt.out 2>&1"
        " || { cat /root/apt.out; exit 1; }\n"
        f"cat /root/apt.out\ngrep -q '^rdna1-kmgr: {new}: patched: ' /root/apt.out"
    )
    # apt unpacks two kernel packages and makes an initramfs, then follow makes another: an hour under TCG at most
    return record(stage, "follow", command, system=system, kernel=new, before=confirmed, timeout=3600)


def journal_started(recording: Recording) -> tuple[pc.Survey, list[pc.Survey]]:
    """The last point of the run before its kernel's journal has a record, and the points from the first on."""
    inside = recording.inside
    first = next(i for i, s in enumerate(inside) if s.journal)
    assert first > 0, f"{recording.name}: the journal has a record at the run's first point"
    return inside[first - 1], inside[first:]


@pytest.fixture(scope="module")
def references(request, stage) -> Callable[[Recording], tuple[dict[str, str], set[str]]]:
    """The watched files as a run's journal began, and the grub.cfg allowed (power_cut.reference), made once per
    run: the install's at its first point, which the rollback shares (it rolls that install back); follow's at its
    last point before its install's first record (what apt did before that is dpkg's work, not the tool's)."""
    found: dict[str, tuple[dict[str, str], set[str]]] = {}

    def reference(recording: Recording) -> tuple[dict[str, str], set[str]]:
        if recording.name == "follow":
            source, point = recording, journal_started(recording)[0].point
        else:
            source = request.getfixturevalue("installed")
            point = min(s.point for s in source.inside)
        if source.name not in found:
            image = stage.area.snapshot(source.snapshots[point], "reference.img")
            try:
                found[source.name] = pc.reference(image, recording.kernel, stage.system.logs)
            finally:
                image.unlink()
        return found[source.name]

    return reference


RUNS = ["installed", "rolled_back", "followed"]


@pytest.mark.parametrize("run", RUNS)
def test_power_cut_the_log_replayed_whole_is_the_disk_the_run_left(request, run):
    """What makes every point a disk the run really passed through: the guest's writes, applied in the log's order
    to the disk as the boot started, give the disk as the boot left it, byte for byte (a write the log missed, or
    a change on the host the log cannot know, would show here)."""
    recording = request.getfixturevalue(run)
    assert recording.replay_mismatch is None, recording.replay_mismatch


@pytest.mark.parametrize("run", RUNS)
def test_power_cut_every_point_mounts_with_a_well_formed_grubenv(request, run):
    recording = request.getfixturevalue(run)
    bad = {s.point: s.problems for s in recording.surveys if s.problems}
    assert not bad, f"{len(bad)} of {len(recording.surveys)} points, the first: {dict(list(bad.items())[:3])}"
    assert len(recording.inside) >= 5, "fewer flushes than the run's own fsyncs alone would make"
    lagging = [s for s in recording.inside if s.grub_env != s.kernel_env]
    # The boot guard's step checkpoints ext4's journal after its GRUB writes (install/grub_commands.py), before its
    # record: from the record on, GRUB reads what the kernel reads
    settled = "undone boot-guard" if recording.name == "rollback" else "done boot-guard"
    late = [s.point for s in lagging if settled in s.journal]
    assert not late, f"GRUB reads other variables than the kernel after `{settled}` is on disk, at points {late}"
    recording.stage.say(
        f"{recording.name}: {len(recording.surveys)} points mount, grubenv well formed; at {len(lagging)} of the "
        f"{len(recording.inside)} in the {recording.name} GRUB reads other variables than the kernel: "
        + ", ".join(f"{s.point} ({s.journal[-1] if s.journal else 'no journal'})" for s in lagging)
    )


@pytest.mark.parametrize("run", ["installed", "followed"])
def test_power_cut_the_install_journal_is_always_a_prefix_of_the_finished_one(request, run):
    """The journal only grows by whole records (a last line cut short at most): never a line the tool did not
    write, never one lost. Follow's install is the same journaled install, for the new kernel."""
    recording = request.getfixturevalue(run)
    final = recording.surveys[-1].journal
    assert final and final[0] == "begin" and final[-1] == "commit", final
    for s in recording.surveys:
        assert s.journal == final[: len(s.journal)], f"point {s.point}: {s.journal} is not a prefix of {final}"
    states = len({s.journal for s in recording.inside})
    recording.stage.say(f"{recording.name}: {states} journal states, up to {len(final)} records")


def test_power_cut_the_rollback_journal_extends_the_install_one_then_goes(installed, rolled_back):
    """Through the rollback the journal only grows, from the install's, until it moves to the history."""
    final = installed.surveys[-1].journal
    longest = max((s.journal for s in rolled_back.surveys), key=len)
    assert longest[: len(final)] == final and longest[-1] == "rolled-back", longest
    for s in rolled_back.surveys:
        assert s.journal == longest[: len(s.journal)], f"point {s.point}: {s.journal} is not a prefix of {longest}"
    assert rolled_back.surveys[-1].journal == (), "the journal went to the history once rolled back"


@pytest.mark.parametrize("run", RUNS)
def test_power_cut_rollback_at_each_chosen_point_restores_every_file(request, references, run):
    recording = request.getfixturevalue(run)
    stage = recording.stage
    before, grub_cfgs = references(recording)
    # Follow's points from its install's first record on: before it, its kernel has nothing to roll back
    surveys = journal_started(recording)[1] if recording.name == "follow" else list(recording.surveys)
    chosen = surveys if FULL else pc.choose(surveys, recording.window, INTERIOR)
    started = time.monotonic()
    checks = []
    for s in chosen:
        copy = stage.area.snapshot(recording.snapshots[s.point], f"check-{recording.name}-{s.point}.img")
        checks.append(
            pc.check_rollback(s, copy, recording.kernel, stage.system.logs, before, grub_cfgs, recording.name)
        )
        copy.unlink()
    stage.say(
        f"{recording.name}: rolled back {recording.kernel} at {len(checks)} of {len(recording.surveys)} points in "
        f"{time.monotonic() - started:.0f} s"
    )
    bad = {c.point: (" | ".join(c.journal[-2:]), c.problems) for c in checks if c.problems}
    assert not bad, f"{len(bad)} of {len(checks)} points do not roll back exactly, the first: {list(bad.items())[:3]}"


def _last_point_of(recording: Recording, kind_step: str) -> pc.Survey:
    """The last point whose journal ends in `kind_step`: the step's output as far as it got before `done`."""
    return [s for s in recording.inside if s.journal and s.journal[-1] == kind_step][-1]


def _first_committed(recording: Recording) -> pc.Survey:
    found = [s for s in recording.inside if "commit" in s.journal]
    assert found, "no point before the run's end has the journal's commit record on disk"
    return found[0]


BOOTED = [("after-last-record", _first_committed)]
if FULL:
    BOOTED += [
        ("after-initramfs", lambda r: _last_point_of(r, "intent initramfs")),
        ("after-grubenv", lambda r: _last_point_of(r, "intent boot-guard")),
    ]


@pytest.mark.parametrize("name,pick", BOOTED, ids=[name for name, _ in BOOTED])
def test_power_cut_point_boots_and_status_tells_the_truth(installed, tmp_path, name, pick):
    point = pick(installed)
    stage = installed.stage
    image = stage.area.snapshot(installed.snapshots[point.point], f"boot-{name}.img")
    try:
        # Booted as the cut left it: the step is already on the disk (record), nothing mounts it first
        boot = qemu_boot(image, tmp_path / "boot.log", timeout=900)
        step_rc, step_out = read_step(image) if not boot.timed_out else (None, "")
    finally:
        image.unlink()
    assert not boot.timed_out and step_rc == 0, f"point {point.point} did not come up:\n{boot.tail(40)}"
    found = facts(step_out)
    status = json.loads(found["status"])
    running = next(k for k in status["kernels"] if k["running"])
    stage.say(
        f"booted point {point.point} ({name}, journal ends {point.journal[-1]}; GRUB reads {dict(point.grub_env)}):"
        f" {found['cmdline']}"
    )
    patched = found["quirks"] != "none"
    assert running["loaded"]["is_this_module"] is patched, running["loaded"]
    assert running["journal"]["state"] == ("installed" if "commit" in point.journal else "install unfinished")
    guard = status["boot_guard"]
    on_cmdline = next((w.split("=", 1)[1] for w in found["cmdline"].split() if w.startswith("rdna1_kmgr.boot=")), None)
    assert guard.get("this_boot") == on_cmdline, guard
    if name == "after-last-record":
        # The guard decides the boot either way: a trial with the quirks when GRUB reads the armed environment, a
        # fallback boot with the distribution's amdgpu when the cut came before the kernel wrote it where GRUB
        # reads (GRUB does not replay ext4's journal)
        armed = dict(point.grub_env).get("rdna1_kmgr") == "trial"
        assert on_cmdline == ("trial" if armed else "fallback"), (dict(point.grub_env), found["cmdline"])
        assert patched is armed, found
        if armed:
            assert int(found["quirks"], 0) == int(stage.mask, 0), found
