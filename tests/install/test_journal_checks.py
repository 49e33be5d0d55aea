"""Issue 40, M3: journal replay trusts only what it can check. Each test forges a record the way someone who
could write the journal would (a valid line with a valid sum) and runs the real `rdna1-kmgr rollback`: the
record is refused in one line, nothing is restored or removed (not even the genuine steps around it), the
journal stays byte for byte, the exit is non-zero. A genuine journal still rolls back bit for bit."""

import dataclasses
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rdna1_kmgr.core import keeper
from rdna1_kmgr.core.errors import Exit
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install import journal_programs
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_json import NotARecord
from rdna1_kmgr.install.journal_records import (
    Done,
    ExperimentBegin,
    Intent,
    ProfileBegin,
    Program,
    WasAbsent,
    WasFile,
)

KREL = "6.1.0-56-amd64"
CLI = Path(sys.executable).parent / "rdna1-kmgr"


@pytest.fixture
def system(tmp_path, monkeypatch):
    """A scratch root with an initramfs and a module index, the tool's state beside it."""
    root = tmp_path / "root"
    (root / "boot").mkdir(parents=True)
    (root / "lib/modules" / KREL).mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "boot" / f"initrd.img-{KREL}").write_bytes(b"the distribution's initramfs\x00\x01")
    os.chmod(root / "boot" / f"initrd.img-{KREL}", 0o600)
    (root / "lib/modules" / KREL / "modules.dep").write_bytes(b"kernel/a.ko:\n")
    env = {"RDNA1_KMGR_ROOT": str(root), "RDNA1_KMGR_STATE": str(tmp_path / "state")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return root


def _genuine_steps(root: Path) -> jr.Journal:
    """Two steps as install writes them: the initramfs replaced, the stock loader's rule created."""
    journal = jr.Journal(KREL)
    journal.begin(InstallBegin(kernel=KREL, root=str(root)))
    initrd = root / "boot" / f"initrd.img-{KREL}"
    journal.record_intent("initramfs", None, [initrd, initrd.with_name(initrd.name + ".new")], [])
    initrd.write_bytes(b"rdna1-kmgr's initramfs")
    initrd.chmod(0o644)
    journal.append(Done("initramfs"))
    return journal


def _second_step(journal: jr.Journal, root: Path) -> Path:
    rule = root / "etc/modprobe.d/rdna1-kmgr-loader.conf"
    journal.record_intent("stock-loader", None, [rule], [rule.parent])
    rule.parent.mkdir()
    rule.write_text("install amdgpu /usr/local/lib/rdna1-kmgr/amdgpu-loader\n")
    journal.append(Done("stock-loader"))
    return rule


def _rollback() -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CLI), "rollback", "--kernel", KREL, "--yes"], capture_output=True, text=True, env=os.environ.copy()
    )


def _forge(journal: jr.Journal, fields: dict) -> None:
    """A line as someone who could write the journal would write it: the next seq, a valid sum."""
    seq = len(journal.path.read_bytes().splitlines()) + 1
    record = {"seq": seq, "time": "2026-11-20T10:00:00+0000", **fields}
    record["sum"] = hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    with open(journal.path, "ab") as out:
        out.write(json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n")


def _forged_intent(journal: jr.Journal, root: Path, forge: str) -> None:
    """A record someone else wrote: each restores or removes something the step never touches."""
    seq = len(journal.records()) + 1
    initrd = str(root / "boot" / f"initrd.img-{KREL}")
    entry = WasFile(initrd, f"{seq:03d}-0", "0" * 64, 0o644, 0, 0)
    dirs, undo = (), None
    if forge == "absolute backup name":
        entry = dataclasses.replace(entry, backup="/etc/shadow")
    elif forge == "../ backup name":
        entry = dataclasses.replace(entry, backup="../../../../etc/shadow")
    elif forge == "target outside the step's paths":
        victim = root / "etc/cron.d/rdna1"
        journal.backups.mkdir(parents=True, exist_ok=True)
        (journal.backups / entry.backup).write_bytes(b"* * * * * root sh -c evil\n")
        entry = dataclasses.replace(entry, path=str(victim), sha256=jr.sha256_file(journal.backups / entry.backup))
    elif forge == "unknown kind":
        _forge(journal, {"kind": "exec", "argv": ["sh", "-c", "touch /tmp/owned"]})
        return
    elif forge == "a JSON true as the owner":  # Python's bool is an int: True would pass for uid 1
        entry = dataclasses.replace(entry, uid=True)
    elif forge == "a folder not above its file":  # rollback removes a step's folders when they are empty
        dirs = (str(root / "etc"),)
    elif forge == "an undo no step writes":
        undo = {"kind": "files", "after": [["sh", "-c", "touch /tmp/owned"]], "shell": True}
    journal.append(Intent("initramfs", None, (entry,), dirs, undo))


@pytest.mark.parametrize(
    "forge, why",
    [
        ("absolute backup name", "names the backup '/etc/shadow'"),
        ("../ backup name", "names the backup '../../../../etc/shadow'"),
        ("target outside the step's paths", "etc/cron.d/rdna1, which its step never writes"),
        ("unknown kind", "record 4 (exec) is of a kind rdna1-kmgr never writes"),
        ("a JSON true as the owner", "has no valid uid for "),
        ("a folder not above its file", "/etc', which is not above a file its step writes"),
        ("an undo no step writes", "records an undo rdna1-kmgr never writes"),
    ],
)
def test_a_forged_record_is_refused_in_one_line_and_nothing_is_undone(system, forge, why):
    journal = _genuine_steps(system)
    _forged_intent(journal, system, forge)
    rule = _second_step(journal, system)  # a genuine step after it: not undone either
    before = journal.path.read_bytes()

    proc = _rollback()

    assert proc.returncode == Exit.JOURNAL
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing the journal" in lines[0] and "record 4" in lines[0], proc.stderr
    assert why in lines[0]
    assert (system / "boot" / f"initrd.img-{KREL}").read_bytes() == b"rdna1-kmgr's initramfs"
    assert rule.is_file()
    assert not (system / "etc/cron.d").exists()
    assert journal.path.read_bytes() == before  # not even a `rollback` record


def test_a_step_restoring_into_another_root_or_running_another_command_is_refused(system):
    journal = _genuine_steps(system)
    journal.append(
        Intent(
            "depmod",
            ("sh", "-c", "id > /tmp/owned"),
            (WasAbsent(str(system / "lib/modules" / KREL / "modules.dep")),),
            (),
        )
    )
    proc = _rollback()
    assert proc.returncode == Exit.JOURNAL
    assert "records the command ['sh', '-c', 'id > /tmp/owned']" in proc.stderr
    assert (system / "lib/modules" / KREL / "modules.dep").is_file()  # `backup: None` would have removed it


def test_a_genuine_journal_rolls_back_bit_for_bit(system):
    initrd = system / "boot" / f"initrd.img-{KREL}"
    original = initrd.read_bytes()
    journal = _genuine_steps(system)
    rule = _second_step(journal, system)
    proc = _rollback()
    assert proc.returncode == 0, proc.stderr
    assert initrd.read_bytes() == original
    assert stat.S_IMODE(initrd.stat().st_mode) == 0o600
    assert not rule.exists() and not rule.parent.exists()
    assert not journal.exists()


@pytest.fixture
def victim():
    """A process that is not one rdna1-kmgr started, as a forged record would name it."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _program(journal: jr.Journal, pid: int, start: int, argv: list[str]) -> None:
    journal.append(Program(pid, start, keeper.boot_id(), tuple(argv)))


@pytest.mark.parametrize(
    "forge, why",
    [
        ("a start time after the process's own", "but the process there has run since"),
        ("the process's start time, another program", "which runs sleep, not a program rdna1-kmgr started"),
        ("a program never run", "names the program 'sleep', which a journaled run never starts"),
    ],
)
def test_a_forged_program_record_stops_nothing_and_undoes_nothing(system, victim, forge, why):
    journal = _genuine_steps(system)
    start = keeper.start_time(victim.pid)
    if forge == "a start time after the process's own":
        _program(journal, victim.pid, start + 1000, ["update-initramfs", "-c", "-k", KREL])
    elif forge == "the process's start time, another program":
        _program(journal, victim.pid, start, ["update-initramfs", "-c", "-k", KREL])
    else:
        _program(journal, victim.pid, start, ["sleep", "300"])
    before = journal.path.read_bytes()

    proc = _rollback()

    assert proc.returncode == Exit.JOURNAL
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "record 4 (program)" in lines[0] and why in lines[0], proc.stderr
    assert victim.poll() is None  # not signalled
    assert (system / "boot" / f"initrd.img-{KREL}").read_bytes() == b"rdna1-kmgr's initramfs"
    assert journal.path.read_bytes() == before


def test_a_reused_pid_is_left_alone_and_the_rollback_goes_on(system, victim):
    """The genuine case a start time differing the other way means: the recorded program ended and the pid
    went to a process that started later. It is not stopped, and the rollback is not refused."""
    journal = _genuine_steps(system)
    _program(journal, victim.pid, keeper.start_time(victim.pid) - 1, ["update-initramfs", "-c", "-k", KREL])
    assert journal_programs.stop_left_over(journal) == []
    proc = _rollback()
    assert proc.returncode == 0, proc.stderr
    assert victim.poll() is None
    assert (system / "boot" / f"initrd.img-{KREL}").read_bytes() == b"the distribution's initramfs\x00\x01"


def test_the_experiments_journal_restores_only_its_boot_files(system):
    """The experiment's rules come from experiment/boot_cells.py (registered there): its own step passes,
    a path outside its files is refused."""
    from rdna1_kmgr.experiment import boot_cells
    from rdna1_kmgr.install import journal_checks
    from rdna1_kmgr.install.profile_journal import ExperimentJournal
    from rdna1_kmgr.install.target_root import TargetRoot
    from rdna1_kmgr.install.undo import Writer, regenerate

    root = TargetRoot(system)
    journal = ExperimentJournal()
    journal.begin(ExperimentBegin("/var/lib/rdna1-kmgr/experiments/x", ("no-cwsr",)))
    paths = [*boot_cells.files(root), system / boot_cells.UNIT_LINK]
    journal.record_intent(
        boot_cells.STEP,
        None,
        replaces=paths,
        dirs=[],
        undo=regenerate(Writer.EXPERIMENT_BOOTS, boot_cells.undo_commands(root)),
    )
    undo = {"kind": "experiment-boots", "after": boot_cells.undo_commands(root)}  # as today's journals write it
    journal_checks.check(journal, root)
    journal.append(Intent(boot_cells.STEP, None, (WasAbsent("/etc/passwd"),), (), undo))
    with pytest.raises(journal_checks.RecordRefused, match=r"record 3 \(intent\) would restore /etc/passwd"):
        journal_checks.check(journal, root)


def test_a_json_true_is_no_session_and_no_start_time():
    """JSON's true reads as Python's True, an int: a program record must not take it for a process."""
    from rdna1_kmgr.install import journal_checks

    genuine = {"argv": ["update-initramfs", "-u"], "session": 4242, "start_time": 99, "boot_id": ""}
    assert journal_checks.program_problem(Program.from_json(genuine)) is None
    with pytest.raises(NotARecord, match="^names the session True, which is no program's$"):
        Program.from_json({**genuine, "session": True})
    with pytest.raises(NotARecord, match="^has no start time for session 4242$"):
        Program.from_json({**genuine, "start_time": True})


def test_a_kernels_journal_begun_by_another_stage_is_refused(system):
    """A kernel's journal is begun by install: one beginning a profile's install is not one install wrote."""
    from rdna1_kmgr.install import journal_checks

    journal = jr.Journal(KREL)
    journal.begin(ProfileBegin("find-fast", str(system)))
    with pytest.raises(journal_checks.RecordRefused) as refused:
        journal_checks.check(journal)
    assert refused.value.what == (
        f"refusing the journal {journal.path}: record 1 (begin) begins 'profile-install' in a journal that only "
        "'install' begins"
    )
