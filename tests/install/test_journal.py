"""The journal: durable records with checksums, backups and exact restores, the run lock, the crash switch."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from rdna1_kmgr import __version__
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import (
    Commit,
    Done,
    Program,
    Rollback,
    RolledBack,
    Undone,
    WasAbsent,
    WasFile,
    WasLink,
)
from rdna1_kmgr.modbuild.dkms_package import Package, Trees

KREL = "6.1.0-56-amd64"


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def test_records_round_trip_in_order_with_checksums(state):
    j = jr.Journal(KREL)
    j.begin(InstallBegin(kernel=KREL, root="/", package=Package("rdna1-amdgpu", "6.1.192+p0123456789ab")))
    j.record_intent("depmod", ["depmod", KREL], [], [])
    j.append(Done("depmod"))
    records = j.records()
    assert [r.kind for r in records] == ["begin", "intent", "done"]
    assert [r.seq for r in records] == [1, 2, 3]
    lines = j.path.read_text().splitlines()
    assert all("sum" in json.loads(line) for line in lines)
    st = j.state()
    assert st.install is not None and st.install.package.version == "6.1.192+p0123456789ab"
    assert [(s.step, s.done) for s in st.steps] == [("depmod", True)]
    assert st.description == "install unfinished"
    assert jr.Journal.kernels() == ["6.1.0-56-amd64"]


def _line(fields: dict) -> bytes:
    """A record as the journal format says (journal.py's docstring): canonical JSON, `sum` the sha256 of the
    other fields."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    summed = dict(fields, sum=hashlib.sha256(canonical.encode()).hexdigest())
    return json.dumps(summed, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def test_each_record_is_written_as_todays_release_writes_it(state, tmp_path, monkeypatch):
    """The records' types change nothing on disk: the lines are the ones written out by hand here."""
    monkeypatch.setattr(jr, "_now", lambda: "2026-11-20T10:00:00+0000")
    rule = tmp_path / "rule.conf"
    rule.write_bytes(b"the owner's rule\n")
    rule.chmod(0o640)
    j = jr.Journal(KREL)
    j.begin(
        InstallBegin(
            kernel=KREL,
            root="/",
            package=Package("rdna1-amdgpu", "6.1.192+p0123abcd"),
            module="/m.ko",
            module_sha256="5" * 64,
            vm_check={"verdict": "pass"},
            parameters={"rdna1_quirks": "0x30"},
            certificate="/mok.pub",
            trees=Trees(),
        )
    )
    j.record_intent("stock-loader", None, [rule], [tmp_path / "absent"])
    j.append(Done("stock-loader"))
    j.append(Program(4243, 99, "", ("update-initramfs", "-u")))
    j.append(Commit({"module": "/m.ko"}))
    j.append(Rollback("rdna1-kmgr rollback", keep_build=True))
    j.append(Undone("stock-loader", 2))
    j.append(RolledBack())
    at = {"time": "2026-11-20T10:00:00+0000"}
    copied = {"path": str(rule), "backup": "002-0", "sha256": hashlib.sha256(b"the owner's rule\n").hexdigest()}
    copied |= {"mode": 0o640, "uid": os.getuid(), "gid": os.getgid()}
    expected = [
        {"seq": 1, "kind": "begin", **at, "operation": "install", "pid": os.getpid(), "tool_version": __version__}
        | {"kernel": KREL, "package": "rdna1-amdgpu", "version": "6.1.192+p0123abcd", "module": "/m.ko"}
        | {"module_sha256": "5" * 64, "vm_check": {"verdict": "pass"}, "parameters": {"rdna1_quirks": "0x30"}}
        | {"certificate": "/mok.pub", "root": "/", "boot_guard": None}
        | {"trees": {"source": "/usr/src", "dkms": "/var/lib/dkms"}},
        {"seq": 2, "kind": "intent", **at, "step": "stock-loader", "command": None, "backups": [copied]}
        | {"dirs": [str(tmp_path / "absent")], "undo": None},
        {"seq": 3, "kind": "done", **at, "step": "stock-loader"},
        {"seq": 4, "kind": "program", **at, "session": 4243, "start_time": 99, "boot_id": ""}
        | {"argv": ["update-initramfs", "-u"]},
        {"seq": 5, "kind": "commit", **at, "verified": {"module": "/m.ko"}},
        {"seq": 6, "kind": "rollback", **at, "reason": "rdna1-kmgr rollback", "keep_build": True},
        {"seq": 7, "kind": "undone", **at, "step": "stock-loader", "of": 2},
        {"seq": 8, "kind": "rolled-back", **at},
    ]
    assert j.path.read_bytes() == b"".join(_line(fields) for fields in expected)


def test_a_record_no_release_writes_is_refused_in_one_line_naming_it(state):
    j = jr.Journal(KREL)
    j.begin(InstallBegin(kernel=KREL, root="/"))
    fields = {"seq": 2, "kind": "done", "time": "2026-11-20T10:00:00+0000", "step": "depmod", "then": "rm -rf /"}
    with open(j.path, "ab") as out:
        out.write(_line(fields))  # a valid line with a valid sum: only its fields give it away
    with pytest.raises(jr.RecordRefused) as refused:
        j.state()
    assert refused.value.what == (
        f"refusing the journal {j.path}: record 2 (done) has the fields ['step', 'then'], where rdna1-kmgr writes "
        "['step']"
    )


def test_a_torn_last_write_is_dropped_and_overwritten(state):
    j = jr.Journal(KREL)
    j.begin(InstallBegin(kernel=KREL, root="/"))
    with open(j.path, "ab") as out:
        out.write(b'{"seq": 2, "kind": "int')  # the process died in the middle of this write
    assert [r.kind for r in j.records()] == ["begin"]
    j.append(Commit())
    assert [r.kind for r in j.records()] == ["begin", "commit"]
    assert j.path.read_bytes().endswith(b"\n")


@pytest.mark.parametrize("damage", ["garbage", "edited", "reordered", "empty line"])
def test_a_corrupted_journal_is_refused_naming_the_line(state, damage):
    j = jr.Journal(KREL)
    j.begin(InstallBegin(kernel=KREL, root="/"))
    j.record_intent("depmod", ["depmod"], [], [])
    j.append(Done("depmod"))
    lines = j.path.read_text().splitlines(keepends=True)
    if damage == "garbage":
        lines[1] = "this is not json\n"
    elif damage == "edited":
        lines[1] = lines[1].replace('"depmod"', '"rm"', 1)
    elif damage == "reordered":
        lines[1], lines[2] = lines[2], lines[1]
    else:
        lines.insert(1, "\n")
    j.path.write_text("".join(lines))
    with pytest.raises(jr.JournalError) as err:
        j.state()
    assert "corrupted at line 2" in err.value.what
    assert "nothing was changed" in err.value.hint
    with pytest.raises(jr.JournalError):
        j.append(Commit())  # nothing is appended to a journal that cannot be trusted


def test_backups_restore_replaced_files_exactly_and_remove_created_ones(state, tmp_path):
    target = tmp_path / "sys"
    target.mkdir()
    replaced = target / "modules.dep"
    replaced.write_bytes(b"before\x00bytes")
    os.chmod(replaced, 0o640)
    created = target / "rdna1-kmgr.conf"
    link = target / "link"
    link.symlink_to("modules.dep")
    j = jr.Journal(KREL)
    intent = j.record_intent("step", None, [replaced, created, link], [])
    assert [type(b) for b in intent.backups] == [WasFile, WasAbsent, WasLink]
    assert intent.backups[2] == WasLink(str(link), "modules.dep")
    assert (j.backups / intent.backups[0].backup).read_bytes() == b"before\x00bytes"
    assert j.records()[-1].record == intent  # what was written reads back as it was

    replaced.write_bytes(b"after")
    os.chmod(replaced, 0o600)
    created.write_text("options amdgpu rdna1_quirks=0x3\n")
    link.unlink()
    link.symlink_to("elsewhere")
    for _ in range(2):  # restoring is idempotent
        for entry in intent.backups:
            j.restore(entry)
        assert replaced.read_bytes() == b"before\x00bytes"
        assert replaced.stat().st_mode & 0o777 == 0o640
        assert not created.exists()
        assert os.readlink(link) == "modules.dep"


def test_a_damaged_backup_is_not_restored(state, tmp_path):
    f = tmp_path / "f"
    f.write_text("original")
    j = jr.Journal(KREL)
    entry = j.record_intent("step", None, [f], []).backups[0]
    f.write_text("changed")
    (j.backups / entry.backup).write_text("bit rot")
    with pytest.raises(jr.JournalError, match="missing or damaged"):
        j.restore(entry)
    assert f.read_text() == "changed"


def test_created_directories_go_only_when_empty(tmp_path):
    deep = tmp_path / "updates" / "dkms"
    deep.mkdir(parents=True)
    assert jr.remove_created_dirs([str(tmp_path / "updates"), str(deep)]) == [str(deep), str(tmp_path / "updates")]
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "someone-elses").write_text("x")
    assert jr.remove_created_dirs([str(kept)]) == []
    assert kept.is_dir()


def test_archive_moves_the_journal_to_history_and_drops_backups(state, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    j = jr.Journal(KREL)
    j.record_intent("step", None, [f], [])
    j.append(RolledBack())
    kept = j.archive()
    assert kept.parent == state / "history" and kept.is_file()
    assert not j.dir.exists()
    assert jr.Journal.kernels() == []


def test_an_invalid_kernel_release_never_becomes_a_path(state):
    with pytest.raises(Exception, match="invalid kernel release"):
        jr.Journal("../../etc")


def _child(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_lock_keeps_a_second_run_out_and_names_the_holder(state):
    env = {**os.environ, "RDNA1_KMGR_STATE": str(state)}
    holder = _child(
        """
        import sys, time
        from rdna1_kmgr.install import journal
        with journal.locked("install --kernel 6.1.0-56-amd64"):
            print("locked", flush=True)
            time.sleep(30)
    """,
        env,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(jr.Busy) as err:
            with jr.locked("rollback"):
                pass
        assert f"pid {holder.pid}" in err.value.what
        assert "rdna1-kmgr install --kernel 6.1.0-56-amd64" in err.value.what
        assert jr.lock_holder().pid == holder.pid
    finally:
        holder.kill()
        holder.wait()
    # The kernel drops a dead holder's lock: no stale lock to clean up.
    assert jr.lock_holder() is None
    with jr.locked("rollback"):
        assert jr.lock_holder() is None or jr.lock_holder().pid == os.getpid()


def test_the_state_directory_must_be_writable(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(blocker / "state"))
    # refused by the check of the tool's roots (core.paths) before the journal's own
    with pytest.raises(HostError, match="a-file is not a folder"):
        jr.check_writable()
    with pytest.raises(HostError, match="refusing .*a-file/state as a folder of the tool"):
        with jr.locked("install"):
            pass
    assert blocker.read_text() == ""


def test_the_test_only_abort_switch_dies_like_kill_9(state):
    env = {**os.environ, "RDNA1_KMGR_STATE": str(state), jr.ABORT_ENV: "depmod"}
    child = _child(
        """
        from rdna1_kmgr.install import journal
        from rdna1_kmgr.install.journal_records import Done
        j = journal.Journal("6.1.0-56-amd64")
        j.append(Done("depmod"))
        journal.abort_point("modprobe-conf")
        journal.abort_point("depmod")
        print("not reached")
    """,
        env,
    )
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 137
    assert out == ""
    assert [r.kind for r in jr.Journal(KREL).records()] == ["done"]
