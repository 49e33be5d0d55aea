"""Every journal record, typed (install/journal_records.py), against the JSON today's release writes: each kind
reads back into its record and writes the same, and a record no release writes is refused naming the field.

Expected JSON is written by hand from the journal format (a line's fields but its `sum`), not from the module.
"""

import pytest

from rdna1_kmgr.install.journal_json import NotARecord
from rdna1_kmgr.install.journal_records import (
    Begin,
    Commit,
    Done,
    Entry,
    ExperimentBegin,
    HandedOver,
    Intent,
    KernelRemoved,
    ParameterBegin,
    ProfileBegin,
    Program,
    Rollback,
    RollbackStep,
    RolledBack,
    Undone,
    WasAbsent,
    WasFile,
    WasLink,
)

AT = "2026-11-20T10:00:00+0000"
CONF = "/etc/modprobe.d/rdna1-kmgr.conf"
RULE = "/etc/modprobe.d/rdna1-kmgr-loader.conf"
COPIED = {"path": RULE, "backup": "003-0", "sha256": "a" * 64, "mode": 0o644, "uid": 0, "gid": 0}
UNDO = {"kind": "modprobe-conf", "path": CONF, "kernel": "6.1.0-56-amd64"}


def line(seq: int, kind: str, **fields) -> dict:
    return {"seq": seq, "kind": kind, "time": AT, **fields}


@pytest.mark.parametrize(
    "written, record",
    [
        (
            line(
                1, "begin", operation="profile-install", pid=4242, tool_version="0.1.0", profile="find-fast", root="/"
            ),
            Begin(ProfileBegin("find-fast", "/"), 4242, "0.1.0"),
        ),
        (
            line(
                1,
                "begin",
                operation="kernel-parameter",
                pid=4242,
                tool_version="0.1.0",
                parameter="amdgpu.cwsr_enable=0",
            ),
            Begin(ParameterBegin("amdgpu.cwsr_enable=0"), 4242, "0.1.0"),
        ),
        (
            line(1, "begin", operation="experiment-kernel", pid=7, tool_version="0.1.0", folder="/x", cells=["a", "b"]),
            Begin(ExperimentBegin("/x", ("a", "b")), 7, "0.1.0"),
        ),
        (
            line(
                2,
                "intent",
                step="modprobe-conf",
                command=None,
                backups=[{"path": CONF, "backup": None}],
                dirs=[],
                undo=UNDO,
            ),
            Intent("modprobe-conf", None, (WasAbsent(CONF),), (), UNDO),
        ),
        (
            line(
                3,
                "intent",
                step="stock-loader",
                command=["depmod", "-a"],
                backups=[COPIED, {"path": "/lib/x", "backup": None, "symlink": "../y"}],
                dirs=["/etc/modprobe.d"],
                undo=None,
            ),
            Intent(
                "stock-loader",
                ("depmod", "-a"),
                (WasFile(RULE, "003-0", "a" * 64, 0o644, 0, 0), WasLink("/lib/x", "../y")),
                ("/etc/modprobe.d",),
            ),
        ),
        (line(4, "done", step="stock-loader"), Done("stock-loader")),
        (
            line(5, "commit", verified={"module": "/lib/modules/x/amdgpu.ko"}),
            Commit({"module": "/lib/modules/x/amdgpu.ko"}),
        ),
        (line(5, "commit"), Commit()),
        (
            line(6, "program", session=4243, start_time=99, boot_id="", argv=["update-initramfs", "-u"]),
            Program(4243, 99, "", ("update-initramfs", "-u")),
        ),
        (line(7, "rollback", reason="rdna1-kmgr rollback", keep_build=False), Rollback("rdna1-kmgr rollback", False)),
        (line(8, "undone", step="stock-loader", of=3), Undone("stock-loader", 3)),
        (line(9, "rollback-step", step="depmod"), RollbackStep("depmod")),
        (line(10, "rolled-back"), RolledBack()),
        (line(10, "kernel-removed"), KernelRemoved()),
        (line(11, "handed-over", of=3, entry=COPIED), HandedOver(3, WasFile(RULE, "003-0", "a" * 64, 0o644, 0, 0))),
    ],
)
def test_each_record_as_the_journal_writes_it_reads_back_and_writes_the_same(written, record):
    entry = Entry.from_json(written)
    assert entry == Entry(written["seq"], AT, record)
    assert entry.to_json() == written


@pytest.mark.parametrize(
    "written, why",
    [
        (line(2, "exec", argv=["sh"]), "is of a kind rdna1-kmgr never writes"),
        (
            line(2, "done", step="x", shell="rm -rf /"),
            "has the fields ['shell', 'step'], where rdna1-kmgr writes ['step']",
        ),
        (line(2, "done"), "has the fields [], where rdna1-kmgr writes ['step']"),
        (line(2, "done", step=["x"]), "has the step ['x'], which is no text"),
        (line(2, "rollback", reason="r", keep_build="no"), "has the keep_build 'no', which is neither true nor false"),
        (line(2, "undone", step="x", of="3"), "does not name the record it undid"),
        (line(2, "undone", step="x", of=True), "does not name the record it undid"),
        (line(2, "program", session=True, start_time=1, boot_id="", argv=["dkms"]), "names the session True"),
        (line(2, "program", session=9, start_time=1, boot_id="", argv=[]), "has no command line"),
        (line(2, "program", session=9, start_time=1, boot_id=None, argv=["dkms"]), "has no boot id for session 9"),
        (line(2, "intent", step="s", command=[], backups=[], dirs=[], undo=None), "has the command [], which is no"),
        (line(2, "intent", step="s", command=None, backups={}, dirs=[], undo=None), "has no list of backups"),
        (line(2, "intent", step="s", command=None, backups=[], dirs=[], undo=["files"]), "undo ['files'], which is no"),
        (
            line(2, "intent", step="s", command=None, backups=[{**COPIED, "uid": True}], dirs=[], undo=None),
            f"has no valid uid for {RULE}",
        ),
        (
            line(2, "intent", step="s", command=None, backups=[{**COPIED, "mode": 0o10000}], dirs=[], undo=None),
            f"has no valid mode for {RULE}",
        ),
        (
            line(2, "intent", step="s", command=None, backups=[{**COPIED, "sha256": "sum"}], dirs=[], undo=None),
            f"has no sha256 for the backup of {RULE}",
        ),
        (
            line(2, "intent", step="s", command=None, backups=[{**COPIED, "symlink": "x"}], dirs=[], undo=None),
            "where rdna1-kmgr writes",
        ),
        (
            line(
                2,
                "intent",
                step="s",
                command=None,
                backups=[{"path": RULE, "backup": None, "symlink": 7}],
                dirs=[],
                undo=None,
            ),
            f"has a bad link for {RULE}",
        ),
        (line(2, "handed-over", of=3, entry={"path": "/etc/shadow"}), "where rdna1-kmgr writes ['backup', 'path']"),
        (line(2, "commit", verified=[]), "has the verification [], which is no object"),
        (line(2, "rolled-back", by="x"), "where rdna1-kmgr writes []"),
        (line(1, "begin", operation="install", tool_version="0.1.0", kernel="k"), "has no pid"),
        ({"seq": 2, "kind": "done", "step": "x"}, "has the time None, which is no text"),
    ],
)
def test_a_record_no_release_writes_is_refused_naming_what_is_wrong(written, why):
    with pytest.raises(NotARecord) as refused:
        Entry.from_json(written)
    assert why in str(refused.value)
