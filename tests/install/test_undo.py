"""The undo an intent record carries (install/undo.py), and rollback as the list of its stages.

Expected JSON is written by hand from the journal format as today's release writes it (install/journal.py's
docstring: one canonical-JSON record a line, `sum` the sha256 of the other fields), not from undo.py.
"""

import hashlib
import json
import os
from pathlib import Path

import pytest
from install_checks import journal_root  # noqa: F401 (fixture)

from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install import rollback, stock_loader
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import Commit, Done, Intent, WasAbsent
from rdna1_kmgr.install.undo import (
    DkmsUninstall,
    NotAnUndo,
    Regenerate,
    RewriteModprobeConf,
    Writer,
    from_json,
)
from rdna1_kmgr.modbuild.dkms_package import Trees

DKMS_UNINSTALL = {
    "kind": "dkms-uninstall",
    "package": "rdna1-amdgpu",
    "version": "6.1.192+p0123abcd",
    "kernel": "6.1.0-56-amd64",
    "command": ["dkms", "uninstall", "-m", "rdna1-amdgpu", "-v", "6.1.192+p0123abcd", "-k", "6.1.0-56-amd64"],
    "trees": {"source": "/usr/src", "dkms": "/var/lib/dkms"},
}
MODPROBE_CONF = {"kind": "modprobe-conf", "path": "/etc/modprobe.d/rdna1-kmgr.conf", "kernel": "6.1.0-56-amd64"}
BOOT_GUARD = {"kind": "boot-guard", "after": [["update-grub"], ["grub-editenv", "-", "unset", "rdna1_trial"]]}


@pytest.mark.parametrize(
    "written, expected",
    [
        (
            DKMS_UNINSTALL,
            DkmsUninstall(
                "rdna1-amdgpu",
                "6.1.192+p0123abcd",
                "6.1.0-56-amd64",
                tuple(DKMS_UNINSTALL["command"]),
                Trees(Path("/usr/src"), Path("/var/lib/dkms")),
            ),
        ),
        (MODPROBE_CONF, RewriteModprobeConf(Path("/etc/modprobe.d/rdna1-kmgr.conf"), "6.1.0-56-amd64")),
        (
            BOOT_GUARD,
            Regenerate(Writer.BOOT_GUARD, (("update-grub",), ("grub-editenv", "-", "unset", "rdna1_trial"))),
        ),
        ({"kind": "files", "after": [["update-grub"]]}, Regenerate(Writer.FILES, (("update-grub",),))),
        (
            {"kind": "experiment-boots", "after": [["update-grub"]]},
            Regenerate(Writer.EXPERIMENT_BOOTS, (("update-grub",),)),
        ),
        (None, None),
    ],
    ids=["dkms-uninstall", "modprobe-conf", "boot-guard", "files", "experiment-boots", "none"],
)
def test_each_undo_as_journals_write_it_reads_back_and_writes_the_same(written, expected):
    undo = from_json(written)
    assert undo == expected
    assert (undo.to_json() if undo else None) == written


def test_only_the_modprobe_file_is_rewritten_instead_of_restored():
    assert not from_json(MODPROBE_CONF).restores_files
    assert from_json(DKMS_UNINSTALL).restores_files and from_json(BOOT_GUARD).restores_files


@pytest.mark.parametrize(
    "written",
    [
        {"kind": "shell", "after": [["rm", "-rf", "/"]]},  # a kind no code writes
        {**MODPROBE_CONF, "command": ["rm", "/etc/passwd"]},  # a key too many
        {"kind": "modprobe-conf", "path": "/etc/modprobe.d/rdna1-kmgr.conf"},  # one missing
        {**BOOT_GUARD, "after": "update-grub"},  # commands that are a string
        {**BOOT_GUARD, "after": [[]]},  # an empty command
        {**DKMS_UNINSTALL, "command": ["dkms", True]},  # an argument that is no string
        {**DKMS_UNINSTALL, "kernel": "6.1.0-56-amd64\0"},
        {**DKMS_UNINSTALL, "trees": {"source": "/usr/src"}},
        ["modprobe-conf"],
    ],
)
def test_an_undo_no_release_writes_is_refused(written):
    with pytest.raises(NotAnUndo):
        from_json(written)


# --- a journal as today's release writes it --------------------------------------------------------------

KERNEL = "6.1.0-56-amd64"


def _line(seq: int, kind: str, **fields) -> bytes:
    record = {"seq": seq, "kind": kind, "time": "2026-11-20T10:00:00+0000", **fields}
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    record["sum"] = hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def test_a_journal_written_by_todays_release_plans_and_rolls_back_exactly(journal_root, tmp_path):
    root = journal_root
    rule, conf = root / stock_loader.RULE, root / "etc/modprobe.d/rdna1-kmgr.conf"
    found = b"options amdgpu dc=1  # the owner's own rule, there before the install\n"
    rule.write_bytes(b"the install's rule\n")
    conf.write_bytes(f"options amdgpu rdna1_quirks=0x30  # {KERNEL}\n".encode())
    state = tmp_path / "state/journal" / KERNEL
    (state / "backups").mkdir(parents=True)
    (state / "backups/004-0").write_bytes(found)
    os.chmod(state / "backups/004-0", 0o640)
    records = [
        _line(
            1,
            "begin",
            operation="install",
            pid=4242,
            tool_version="0.1.0",
            kernel=KERNEL,
            package="rdna1-amdgpu",
            version="6.1.192+p0123abcd",
            module=f"/lib/modules/{KERNEL}/updates/dkms/amdgpu.ko.xz",
            module_sha256="5" * 64,
            vm_check="passed",
            parameters={"rdna1_quirks": "0x30"},
            certificate="/var/lib/dkms/mok.pub",
            root=str(root),
            boot_guard=None,
            trees={"source": str(tmp_path / "usr-src"), "dkms": str(tmp_path / "dkms")},
        ),
        _line(
            2,
            "intent",
            step="modprobe-conf",
            command=None,
            backups=[{"path": str(conf), "backup": None}],
            dirs=[],
            undo={"kind": "modprobe-conf", "path": str(conf), "kernel": KERNEL},
        ),
        _line(3, "done", step="modprobe-conf"),
        _line(
            4,
            "intent",
            step="stock-loader",
            command=None,
            backups=[
                {
                    "path": str(rule),
                    "backup": "004-0",
                    "sha256": hashlib.sha256(found).hexdigest(),
                    "mode": 0o640,
                    "uid": 0,
                    "gid": 0,
                }
            ],
            dirs=[],
            undo=None,
        ),
        _line(5, "done", step="stock-loader"),
        _line(6, "commit", verified={"module": f"/lib/modules/{KERNEL}/updates/dkms/amdgpu.ko.xz"}),
    ]
    (state / "journal.jsonl").write_bytes(b"".join(records))

    plan = rollback.run(KERNEL, keep_build=True, dry_run=True).plan
    assert plan[1:] == [
        "  undo stock-loader:",
        f"      restore {rule} from the journal's backup",
        "      remove the temporary files rdna1-kmgr or depmod left beside them (if a write cut short left any)",
        "  undo modprobe-conf:",
        f"      remove {conf} (if present)",
        "      remove the temporary files rdna1-kmgr or depmod left beside them (if a write cut short left any)",
        "  keep the build rdna1-amdgpu/6.1.192+p0123abcd (--keep-build)",
        f"  move the journal to the history; drop its backups in {state / 'backups'}/",
    ]
    assert rule.read_bytes() == b"the install's rule\n"  # the dry run changed nothing

    rollback.run(KERNEL, keep_build=True)
    assert rule.read_bytes() == found and rule.stat().st_mode & 0o7777 == 0o640
    assert not conf.exists()
    assert jr.Journal.kernels() == []
    (history,) = (tmp_path / "state/history").iterdir()
    kinds = [json.loads(line)["kind"] for line in history.read_text().splitlines()]
    assert kinds[len(records) :] == ["rollback", "undone", "undone", "rolled-back"]


def test_a_later_journal_with_an_undo_no_release_writes_refuses_in_one_line(journal_root, monkeypatch):
    # rollback --kernel of the earlier install reads the later install's files first (refuse_under_a_later_install):
    # the earlier journal is genuine, the later one carries an undo no release writes
    conf = journal_root / "etc/modprobe.d/rdna1-kmgr.conf"
    earlier, later = "6.12.118+deb13-amd64", "7.3.4+deb13-amd64"
    for kernel, at in ((earlier, "2026-11-26T20:00:00+0000"), (later, "2026-11-26T21:30:00+0000")):
        monkeypatch.setattr(jr, "_now", lambda at=at: at)
        journal = jr.Journal(kernel)
        journal.begin(InstallBegin(kernel=kernel, root=str(journal_root)))
        if kernel == earlier:
            journal.record_intent("modprobe-conf", None, [conf], [], undo=RewriteModprobeConf(conf, kernel))
        else:
            undo = {"kind": "shell", "after": [["sh", "-c", "true"]]}
            journal.append(Intent("modprobe-conf", None, (WasAbsent(str(conf)),), (), undo))
        journal.append(Done("modprobe-conf"))
        journal.append(Commit())
    with pytest.raises(jr.JournalError, match=r"record 2 \(modprobe-conf\) of a journal records an undo"):
        rollback.run(earlier)
    assert sorted(jr.Journal.kernels()) == [earlier, later]  # nothing rolled back
