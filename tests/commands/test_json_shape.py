"""Every command's `--json` keeps its keys and shapes: scripts read them. The expected key trees were written by
hand from main's output before the results were typed (issue 41); a change here is a change for every script
that reads it, and goes into the README's changelog."""

from __future__ import annotations

import json

import fake_kernel
import pytest
from click.testing import CliRunner
from json_fixtures import documented_schemas, problems
from sysfs_fixtures import FakeSysroot, rx5600xt

from rdna1_kmgr.cli import main
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import Commit
from rdna1_kmgr.modbuild.dkms_package import Package, Trees
from rdna1_kmgr.vm import vfio_journal

OLD, NEW = "6.1.0-56-amd64", "6.12.95+deb12-amd64"
VERSION = "6.1.192+p0123456789ab"

# Leaves: the JSON type; a list: the shape every item has ([] when the list is empty here).
STR, INT, BOOL, NULL = "str", "int", "bool", "null"


def shape(value):
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        shapes = [shape(item) for item in value]
        assert all(s == shapes[0] for s in shapes), f"a list of mixed shapes: {shapes}"
        return shapes[:1]
    if value is None:
        return NULL
    return {bool: BOOL, int: INT, str: STR}[type(value)]


@pytest.fixture
def host(tmp_path, monkeypatch):
    root = tmp_path / "root"
    FakeSysroot(root).kernel(OLD).os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)")
    for name, folder in {
        "RDNA1_KMGR_ROOT": root,
        "RDNA1_KMGR_STATE": tmp_path / "state",
        "RDNA1_KMGR_DKMS_SOURCE_TREE": tmp_path / "usr-src",
        "RDNA1_KMGR_DKMS_TREE": tmp_path / "var-lib-dkms",
        "RDNA1_KMGR_CACHE": tmp_path / "cache",
        "RDNA1_KMGR_LOG": tmp_path / "log",
    }.items():
        monkeypatch.setenv(name, str(folder))
    return tmp_path


def opt_in(base) -> None:
    """A finished install's journal for OLD, written with the journal's own API."""
    journal = jr.Journal(OLD)
    journal.begin(
        InstallBegin(
            kernel=OLD,
            root=str(base / "root"),
            package=Package("rdna1-amdgpu", VERSION),
            module_sha256="5" * 64,
            vm_check={"verdict": "pass", "mode": "emulated", "record": "/var/lib/rdna1-kmgr/verdicts/x.json"},
            parameters={"rdna1_quirks": "0x3"},
            trees=Trees(base / "usr-src", base / "var-lib-dkms"),
        )
    )
    journal.append(Commit(verified={}))


def cli_json(*args: str, exit_code: int = 0):
    """The command's --json document, its fields without the envelope's "output_schema" (docs/reference.md: the
    command's words joined by dots, version 1), which is checked here."""
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == exit_code, result.output
    document = json.loads(result.stdout)
    assert problems(document, documented_schemas()[0]) == []
    leading = [a for a in args[: next((i for i, a in enumerate(args) if a.startswith("-")), len(args))]]
    words = [a for a in leading if a not in (NEW, OLD)][:2]  # a kernel or a profile named after them is no word
    assert document.pop("output_schema") == "rdna1-kmgr." + ".".join(words) + "/1"
    return document


STATUS_TOP = {
    "boot_guard": {"installed": BOOL},
    "certificate": {"enrollment": STR, "path": STR},
    "compiler_cache": {"bytes": INT, "max_size": NULL, "path": STR},
    "profile": {
        "files": {"/etc/environment.d/90-rdna1-kmgr.conf": NULL, "/etc/profile.d/rdna1-kmgr.sh": NULL},
        "installed": NULL,
        "journal": NULL,
        "state": NULL,
    },
    "secure_boot": STR,
}


def test_status_without_anything_installed(host):
    assert shape(cli_json("status")) == {**STATUS_TOP, "kernels": []}


def test_status_of_an_installed_kernel_and_a_pending_one(host):
    opt_in(host)
    assert cli_json("follow", "defer", NEW)["deferred"] is True
    report = cli_json("status")
    kernels = report.pop("kernels")
    assert shape(report) == STATUS_TOP
    assert [k["kernel"] for k in kernels] == [OLD, NEW]
    common = {
        "built": [],
        "dkms": [],
        "kernel": STR,
        "loaded": NULL,
        "module": NULL,
        "next_boot": STR,
        "parameters": {"modprobe.d": [], "ours": NULL},
        "running": BOOL,
    }
    assert shape(kernels[0]) == {
        **common,
        "follow": NULL,
        "journal": {
            "module_sha256": STR,
            "path": STR,
            "since": STR,
            "state": STR,
            "version": STR,
            "vm_check": {"verdict": STR, "mode": STR, "record": STR},
        },
    }
    assert shape(kernels[1]) == {**common, "follow": {"kernel": STR, "state": STR, "updated": STR}, "journal": NULL}


# follow/<KREL>.json as the release before FollowRecord wrote it for each outcome (kernel_follow.py's write
# calls): the record goes into status's JSON key for key, and "installed already" keeps its nulls.
FOLLOW_FILES = {
    "running": {"kernel": NEW, "log": "/var/log/rdna1-kmgr/f.log", "pid": 4242, "state": "running", "updated": "t"},
    "stock": {
        "kernel": NEW,
        "log": "/var/log/rdna1-kmgr/f.log",
        "reason": "linux-headers are missing",
        "stage": "build",
        "state": "stock",
        "updated": "t",
    },
    "patched": {
        "kernel": NEW,
        "log": "/var/log/rdna1-kmgr/f.log",
        "module_sha256": "ab" * 32,
        "package": "rdna1-amdgpu",
        "package_version": VERSION,
        "quirks": ["cwsr-size"],
        "state": "patched",
        "updated": "t",
        "verdict": "pass",
        "verdict_record": "/var/lib/rdna1-kmgr/verdicts/x.json",
    },
    "installed already": {
        "kernel": NEW,
        "module_sha256": None,
        "package": "rdna1-amdgpu",
        "package_version": VERSION,
        "reason": "installed already",
        "state": "patched",
        "updated": "t",
        "verdict": None,
    },
}
FOLLOW_SHAPES = {
    "running": {"kernel": STR, "log": STR, "pid": INT, "state": STR, "updated": STR},
    "stock": {"kernel": STR, "log": STR, "reason": STR, "stage": STR, "state": STR, "updated": STR},
    "patched": {
        "kernel": STR,
        "log": STR,
        "module_sha256": STR,
        "package": STR,
        "package_version": STR,
        "quirks": [STR],
        "state": STR,
        "updated": STR,
        "verdict": STR,
        "verdict_record": STR,
    },
    "installed already": {
        "kernel": STR,
        "module_sha256": NULL,
        "package": STR,
        "package_version": STR,
        "reason": STR,
        "state": STR,
        "updated": STR,
        "verdict": NULL,
    },
}


@pytest.mark.parametrize("outcome", sorted(FOLLOW_FILES))
def test_status_shows_each_kind_of_follow_record_key_for_key(host, outcome):
    folder = host / "state" / "follow"
    folder.mkdir(parents=True)
    (folder / f"{NEW}.json").write_text(json.dumps(FOLLOW_FILES[outcome], indent=2, sort_keys=True))
    (kernel,) = cli_json("status")["kernels"]
    assert shape(kernel["follow"]) == FOLLOW_SHAPES[outcome]
    assert kernel["follow"] == FOLLOW_FILES[outcome]


def test_rollback_with_nothing_installed(host):
    assert shape(cli_json("rollback")) == {"dry_run": BOOL, "kernels": [], "message": STR, "nothing_installed": BOOL}


def test_rollback_dry_run(host):
    opt_in(host)
    expected = {"dry_run": BOOL, "kernels": [STR], "nothing_installed": BOOL, "plan": [STR]}
    assert shape(cli_json("rollback", "--dry-run")) == expected
    assert shape(cli_json("rollback", "--dry-run", "--kernel", OLD)) == expected


def test_follow_modes(host):
    assert shape(cli_json("follow", "pending")) == {"failed": INT, "kernels": [], "lines": []}
    assert shape(cli_json("follow", "pending", "--dry-run")) == {"plan": [STR]}
    assert shape(cli_json("follow", "defer", NEW)) == {"deferred": BOOL, "kernel": STR, "lines": []}
    assert shape(cli_json("follow", "removed", NEW, "--dry-run")) == {"plan": [STR]}
    assert shape(cli_json("follow", "removed", NEW)) == {"kernel": STR, "lines": [], "removed": []}
    assert shape(cli_json("follow", "--kernel", NEW)) == {
        "failed": INT,
        "kernels": [{"kernel": STR, "reason": STR, "state": STR}],
        "lines": [],
    }
    opt_in(host)
    assert shape(cli_json("follow", "defer", NEW)) == {"deferred": BOOL, "kernel": STR, "lines": [STR]}
    assert shape(cli_json("follow", "defer", NEW, "--dry-run")) == {"plan": [STR]}


def test_experiment_status_and_stop_with_no_kernel_cells(host):
    assert shape(cli_json("experiment", "status")) == {"latest": NULL, "running": BOOL}
    assert shape(cli_json("experiment", "stop")) == {"message": STR, "running": BOOL}


def test_doctor(tmp_path):
    report = cli_json("doctor", "--sysroot", str(rx5600xt(tmp_path / "sys").root))
    findings = report.pop("findings")
    assert shape(report) == {
        "board": STR,
        "board_processor": STR,
        "next_step": STR,
        "rocm_loads": STR,
        "summary": {"info": INT, "ok": INT, "problem": INT, "warn": INT},
        "sysroot": STR,
        "user": NULL,
    }
    assert {tuple(sorted(f)) for f in findings} == {("check", "facts", "level", "seen", "todo", "why")}
    (queue,) = [f for f in findings if f["check"] == "queue"]
    assert sorted(queue["facts"]) == [
        "control_stack",
        "how",
        "hsa_use_svm",
        "kernel",
        "rdna1_quirks",
        "runtimes",
        "svm",
        "validates",
    ]


def test_keys_status(tmp_path):
    given = ["--key", str(tmp_path / "no.key"), "--cert", str(tmp_path / "no.crt")]
    assert shape(cli_json("keys", "status", *given)) == {
        "cert": STR,
        "cert_exists": BOOL,
        "certificate": NULL,
        "convention": STR,
        "enroll_command": [STR],
        "enrollment": STR,
        "key": STR,
        "key_exists": BOOL,
        "key_private": BOOL,
        "secure_boot": {"enabled": BOOL, "state": STR},
    }


PROFILE = {
    "experiment_only": NULL,
    "name": STR,
    "set": {"AMDGCN_USE_BUFFER_OPS": STR},  # the variables of no-buffer-ops (userspace/profiles.toml)
    "summary": STR,
    "unset": [STR],
}


def test_profile_list_is_one_key_per_profile_name():
    catalog = cli_json("profile", "list")
    assert {"as-installed", "no-buffer-ops", "override-1030", "small-bar"} <= set(catalog)
    assert shape(catalog["no-buffer-ops"]) == PROFILE
    assert catalog["no-buffer-ops"]["name"] == "no-buffer-ops"
    assert catalog["override-1030"]["experiment_only"]  # a control says why it is not installed


def test_profile_install_and_remove(host):
    assert shape(cli_json("profile", "remove")) == {"dry_run": BOOL, "installed": BOOL, "message": STR}
    plan = {"dry_run": BOOL, "plan": [STR], "profile": PROFILE}
    assert shape(cli_json("profile", "install", "no-buffer-ops", "--dry-run")) == plan
    assert shape(cli_json("profile", "install", "no-buffer-ops")) == {**plan, "done": [STR]}
    assert shape(cli_json("profile", "remove", "--dry-run")) == {"dry_run": BOOL, "installed": BOOL, "plan": [STR]}
    done = {"done": [STR], "dry_run": BOOL, "installed": BOOL, "plan": [STR]}
    assert shape(cli_json("profile", "remove")) == done


BUILD_PLAN = {
    "devices": [STR],
    "dry_run": BOOL,
    "kernel": {"package_version": NULL, "release": STR, "upstream": NULL},
    "plan": [STR],
    "signing": {"cert": STR, "convention": STR, "exists": BOOL, "key": STR},
    "system": {
        "codename": STR,
        "distro": STR,
        "family": STR,
        "running_release": STR,
        "sysroot": STR,
        "version_signature": NULL,
    },
}


def test_build_dry_run_before_and_after_the_source_is_known(host):
    sysroot = str(host / "root")
    early = cli_json("build", "--kernel", OLD, "--dry-run", "--sysroot", sysroot)
    assert shape(early) == {**BUILD_PLAN, "render": NULL, "source": {"tree": NULL}}
    tree = fake_kernel.make_tree(host / "src", version="6.1.192")
    planned = cli_json("build", "--kernel", OLD, "--dry-run", "--sysroot", sysroot, "--source", str(tree))
    assert shape(planned) == {
        **BUILD_PLAN,
        "render": {
            "applies": BOOL,
            "devices": [STR],
            "files": [STR],
            "kernel_version": STR,
            "package": STR,
            "patches": INT,
            "patchset_sha256": STR,
            "quirks_off": [STR],
            "quirks_on": [],  # 6.1 needs no default-on quirk
        },
        "source": {"given": STR, "tree": STR},
    }


def left_on_vfio(bdf: str, pid: int, pid_start: int) -> None:
    """A vfio journal record of a device no bus here has (nothing on the host is touched giving it back)."""
    _, _, boot = vfio_journal.me()
    started = "2026-01-01T00:00:00+00:00"
    vfio_journal.write(
        vfio_journal.Binding(bdf, 0x1002, 0x731F, "amdgpu", None, 14, "r1", pid, pid_start, boot, 1, started)
    )


def test_vm_test_restore(host):
    assert shape(cli_json("vm-test", "restore")) == {"restored": []}
    pid, start, _ = vfio_journal.me()
    left_on_vfio("0000:7f:1f.6", pid, start)  # a running run's: left
    left_on_vfio("0000:7f:1f.7", 1, 1)  # pid 1 started at tick 1 is no rdna1-kmgr: given back, not on the bus
    entry = {"bdf": STR, "detail": STR, "driver": NULL, "ok": BOOL, "wanted": STR}
    assert shape(cli_json("vm-test", "restore", exit_code=4)) == {"restored": [entry]}
