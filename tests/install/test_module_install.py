"""install, rollback and status, the way a user runs them (the CLI in a subprocess).

Fast tests: a stand-in amdgpu (a tiny module named amdgpu with the rdna1_* parameters and the 1002:731F
alias) is built and signed through real DKMS against the installed headers, once per module, into DKMS
trees under tmp; each test gets a scratch system root (RDNA1_KMGR_ROOT) with a "stock" amdgpu, its
module index made by real depmod, an /etc/modprobe.d and an initramfs. Real dkms install/uninstall/remove,
depmod, modinfo, lsinitramfs and unmkinitramfs run against it; only update-initramfs is a test double
(it cannot build an image for a scratch root): a script that packs the root's modules and modprobe.d into
a zstd cpio the real lsinitramfs reads.

Real tests (marked realbuild): the amdgpu that `rdna1-kmgr build` makes for Debian's current 6.1 kernel,
installed into that kernel with its image package installed (as a user's machine has it), with the real
update-initramfs. Each update-initramfs takes ~40 s here, so the real tests share one baseline and run it
three times in all.

Every test compares a hash of what install touches, taken before, with the same hash after: the kernel's
/lib/modules/KREL (paths, types, link targets, modes, contents), /etc/modprobe.d, and the initramfs's file list.
"""

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dkms_helpers import make_keys
from install_checks import (
    assert_same_system,
    ensure_image_installed,
    initramfs_list,
    modinfo_resolves,
    purge_image,
    system_hash,
    tree_digest,
    verdict_record,
)
from install_system import (
    AMD_TREE,
    CLI,
    FakeSystem,
    _new_system,
    build_standin,
    fake_tools,  # noqa: F401  (a fixture)
    one_error_line,
    pristine,  # noqa: F401  (a fixture)
    system,  # noqa: F401  (a fixture)
)
from sysfs_fixtures import FakeSysroot

from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_checks
from rdna1_kmgr.vm import verdict

# real dkms, apt/dpkg, a CPU PyTorch or killed process trees on fixtures: seconds each, out of the fast tier
pytestmark = pytest.mark.system


# --- install and rollback, the whole way ---------------------------------------------------------------------


def test_install_makes_modinfo_resolve_to_the_built_module_and_rollback_restores_everything(system):
    before = system.hash()
    assert system.resolves_to() == system.stock_path

    proc = system.install("--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert system.resolves_to() == system.installed_path
    changed = system.hash()
    assert all(changed[part] != before[part] for part in changed)  # the hash sees all three parts move
    assert jr.sha256_file(system.installed_path) == system.pristine.module_sha256
    assert result["verified"]["sha256"] == system.pristine.module_sha256
    assert result["vm_check"]["verdict"] == "pass"
    conf = system.root / "etc/modprobe.d/rdna1-kmgr.conf"
    assert "options amdgpu rdna1_quirks=0x3" in conf.read_text().splitlines()
    # The image carries the installed module (real unmkinitramfs read it back) and the parameters.
    image_files = initramfs_list(system.root / "boot" / f"initrd.img-{system.kernel}")
    assert str(system.installed_path.relative_to(system.root)) in image_files
    assert "etc/modprobe.d/rdna1-kmgr.conf" in image_files
    assert result["verified"]["initramfs_module"] == str(system.installed_path.relative_to(system.root))
    assert any("amdgpu.rdna1_quirks=0" in line and "rollback" in line for line in result["next_boot"])
    assert (system.pristine.package.version, "installed") in system.dkms_states()
    assert system.journal_kinds()[-1] == "commit"

    proc = system.rollback()
    assert proc.returncode == 0, proc.stderr
    assert_same_system(before, system.hash())
    assert system.resolves_to() == system.stock_path
    # By default the DKMS package goes too: its tree and its source.
    assert system.dkms_states() == []
    assert not system.pristine.package.source_dir(system.pristine.trees).exists()
    assert system.journal_kinds() == []
    assert len(list((system.state / "history").glob("*.jsonl"))) == 1


# `install --json`'s keys, as main's install wrote them before install became a pipeline (issue 41): scripts
# read them, so they stay (a change is named in the README).
PLANNED_KEYS = {"kernel", "package", "package_version", "module_sha256", "vm_check", "parameters", "boot_guard", "plan"}
VERIFIED_KEYS = {"module", "sha256", "initramfs", "initramfs_module"}


def test_install_json_keeps_its_keys_for_the_plan_the_install_and_a_second_install(system):
    dry = system.install("--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert set(planned) == PLANNED_KEYS | {"dry_run", "output_schema"} and planned["dry_run"] is True
    assert planned["output_schema"] == "rdna1-kmgr.install/1"
    assert planned["plan"] == system.install("--dry-run").stdout.splitlines()  # the text is the same plan
    done = system.install("--json")
    assert done.returncode == 0, done.stderr
    installed = json.loads(done.stdout)
    assert set(installed) == PLANNED_KEYS | {"dry_run", "output_schema", "verified", "journal", "next_boot"}
    assert installed["dry_run"] is False and set(installed["verified"]) == VERIFIED_KEYS
    assert installed["plan"] == planned["plan"]
    for extra in ((), ("--dry-run",)):
        again = system.install("--json", *extra)
        assert again.returncode == 0, again.stderr
        same = json.loads(again.stdout)
        named = {"output_schema", "kernel", "package", "package_version", "already_installed", "dry_run"}
        assert set(same) == named | VERIFIED_KEYS
        assert same["already_installed"] is True and same["dry_run"] is bool(extra)
        assert same["sha256"] == system.pristine.module_sha256
    assert system.rollback().returncode == 0


def test_rollback_keep_build_leaves_the_build_for_the_next_install(system):
    before = system.hash()
    assert system.install().returncode == 0
    assert system.rollback("--keep-build").returncode == 0
    assert_same_system(before, system.hash())
    assert system.dkms_states() == [(system.pristine.package.version, "built")]
    # Installing again needs no new build.
    proc = system.install()
    assert proc.returncode == 0, proc.stderr
    assert system.resolves_to() == system.installed_path
    again = system.install()  # the very same module: verified, nothing redone
    assert again.returncode == 0 and "already installed" in again.stdout
    assert system.rollback().returncode == 0
    assert_same_system(before, system.hash())


def test_install_without_an_initramfs_creates_one_and_rollback_removes_it(tmp_path, monkeypatch, pristine, fake_tools):
    fs = _new_system(tmp_path, monkeypatch, pristine, fake_tools, with_initramfs=False)
    fs.write_verdict()
    before = fs.hash()
    assert before["initramfs"] is None
    assert fs.install().returncode == 0
    assert (fs.root / "boot" / f"initrd.img-{fs.kernel}").is_file()
    assert fs.rollback().returncode == 0
    assert_same_system(before, fs.hash())
    assert list((fs.root / "boot").iterdir()) == [fs.root / "boot" / f"vmlinuz-{fs.kernel}"]


def test_a_kernel_whose_image_is_not_installed_gets_the_module_and_no_initramfs(
    tmp_path, monkeypatch, pristine, fake_tools
):
    """A newcomer's machine: the distribution's kernel has its headers (build pulled them) but not its image.
    Install puts the module in place for it; the image package's postinst makes the initramfs later. A kernel
    with neither is refused."""
    fs = _new_system(tmp_path, monkeypatch, pristine, fake_tools, with_initramfs=False, with_image=False)
    fs.write_verdict()
    before = fs.hash()
    dry = fs.cli("install", "--kernel", fs.kernel, "--dry-run", *fs.cert_args)
    assert dry.returncode == 0, dry.stderr
    assert "4. initramfs\n    skipped: " in dry.stdout and "update-initramfs" not in dry.stdout
    assert fs.resolves_to() is None
    assert fs.install().returncode == 0
    assert fs.resolves_to() == fs.installed_path
    assert list((fs.root / "boot").iterdir()) == []  # no initramfs made for a kernel that is not there
    assert fs.rollback().returncode == 0
    assert_same_system(before, fs.hash())
    from rdna1_kmgr.install import module_install
    from rdna1_kmgr.install.target_root import TargetRoot

    module_install.check_kernel_installed(fs.kernel, TargetRoot(fs.root))  # headers only: accepted
    (fs.root / "lib/modules" / fs.kernel / "build").unlink()
    with pytest.raises(module_install.InstallRefused, match="holds neither its modules nor its headers"):
        module_install.check_kernel_installed(fs.kernel, TargetRoot(fs.root))


def test_status_reports_the_install(system):
    proc = system.cli("status", "--json", *system.cert_args)
    assert proc.returncode == 0, proc.stderr
    (k,) = [k for k in json.loads(proc.stdout)["kernels"] if k["kernel"] == system.kernel]
    assert k["dkms"] == [{"package": dkms.PACKAGE_NAME, "version": system.pristine.package.version, "state": "built"}]
    assert k["journal"] is None
    assert k["module"]["path"] == str(system.stock_path) and not k["module"]["rdna1_kmgr"]

    # before the install: the built module and its verdict, which install will ask for
    record = json.loads((system.state / "validations" / f"{system.pristine.module_sha256}.json").read_text())
    verdict_seen = {
        "verdict": "pass",
        "mode": "emulated",
        "kernel": system.kernel,
        "reason": "all checks passed",
        "record": str(system.state / "validations" / f"{system.pristine.module_sha256}.json"),
        "when": record["started"],
        "accel": record["accel"],
        "checked": [c["name"] for c in record["checks"]],
        "failed": [],
    }
    assert [b["verdict"] for b in k["built"]] == [verdict_seen]
    text = system.cli("status", *system.cert_args).stdout
    assert f"  verdict     pass (emulated, {record['accel']}) {record['started']}: checked " in text

    assert system.install().returncode == 0
    status = json.loads(system.cli("status", "--json", *system.cert_args).stdout)
    (k,) = [k for k in status["kernels"] if k["kernel"] == system.kernel]
    assert k["dkms"][0]["state"] == "installed"
    assert k["journal"]["state"] == "installed"
    assert k["module"] == {
        "path": str(system.installed_path),
        "sha256": system.pristine.module_sha256,
        "rdna1_kmgr": True,
        "signature": {
            "signer": "rdna1-kmgr test key",
            "valid": True,
            "detail": f"verifies against {system.pristine.keys.cert}",
        },
        "verdict": verdict_seen,
    }
    # the built module's verdict too (the same file DKMS installed), with when, how and what was checked
    assert k["built"] == [
        {
            "version": system.pristine.package.version,
            "sha256": system.pristine.module_sha256,
            "module": k["built"][0]["module"],
            "verdict": verdict_seen,
            "quirks": k["built"][0]["quirks"],
        }
    ]
    # the build's manifest (write_series above) is on by default with 0x3 and names no left-out quirk
    assert k["built"][0]["quirks"]["default_mask"] == 3 and k["built"][0]["quirks"]["left_out"] == []
    assert {"file": str(system.root / "etc/modprobe.d/rdna1-kmgr.conf"), "options": {"rdna1_quirks": "0x3"}} in k[
        "parameters"
    ]["modprobe.d"]
    assert status["certificate"]["path"] == str(system.pristine.keys.cert)
    text = system.cli("status", *system.cert_args).stdout
    assert "rdna1_quirks=0x3" in text and "(rdna1-kmgr)" in text and "signature   valid" in text
    assert system.rollback().returncode == 0


def test_status_reads_loaded_parameters_and_identity_from_sysfs(system):
    from rdna1_kmgr.follow import status
    from rdna1_kmgr.install.target_root import TargetRoot

    params = system.root / "sys/module/amdgpu/parameters"
    params.mkdir(parents=True)
    (params / "rdna1_quirks").write_text("3\n")
    (params / "rdna1_selftest").write_text("N\n")
    (params / "dpm").write_text("-1\n")
    (system.root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro amdgpu.rdna1_quirks=0 quiet\n")
    root = TargetRoot(system.root)
    assert status.loaded_parameters(root) == {"rdna1_quirks": "3", "rdna1_selftest": "N"}
    assert status.cmdline_options(root) == {"rdna1_quirks": "0"}
    # /run/modprobe.d/x.conf is hidden by /etc/modprobe.d/x.conf of the same name.
    (system.root / "run/modprobe.d").mkdir(parents=True)
    (system.root / "run/modprobe.d/someone-elses.conf").write_text("options amdgpu rdna1_quirks=0x1\n")
    (system.root / "run/modprobe.d/other.conf").write_text("options amdgpu dc=0 # trailing comment\n")
    assert status.configured_options(root) == [
        {"file": str(system.root / "run/modprobe.d/other.conf"), "options": {"dc": "0"}}
    ]
    # The kernel shows a loaded module's build id in /sys/module/<name>/notes (the raw ELF note).
    built = dkms.built_module(system.pristine.package, system.kernel, system.pristine.trees)
    elf = system.root.parent / "amdgpu.ko"
    elf.write_bytes(module_checks.read_module(built))
    note = system.root / "sys/module/amdgpu/notes/.note.gnu.build-id"
    note.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.note.gnu.build-id", str(elf), str(note)], check=True)
    (system.root / "sys/module/amdgpu/initstate").write_text("live\n")
    assert status._loaded_is(built, root) is True
    assert status._loaded_is(system.stock_path, root) is False


# --- dry run ----------------------------------------------------------------------------------------------------


def test_install_dry_run_prints_the_exact_plan_and_changes_nothing(system):
    before = system.hash()
    state_before = tree_digest(system.state)
    dkms_before = tree_digest(system.pristine.trees.dkms)
    proc = system.install("--dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout.splitlines()
    steps = [line for line in plan if line[:1].isdigit()]
    assert [s.split(":")[0] for s in steps] == [
        "1. dkms-install",
        "2. depmod",
        "3. modprobe-conf",
        "4. initramfs",
        "5. verify",
    ]
    assert steps[0].startswith(
        f"1. dkms-install: dkms install -m rdna1-amdgpu -v {system.pristine.package.version} "
        f"-k {system.kernel} --force --no-depmod"
    )
    assert steps[1] == f"2. depmod: depmod -b {system.root} {system.kernel}"
    assert steps[3] == f"4. initramfs: update-initramfs -c -k {system.kernel} -b {system.root / 'boot'}"
    assert f"    create {system.installed_path}" in plan
    assert f"    create {system.root / 'etc/modprobe.d/rdna1-kmgr.conf'}" in plan
    assert f"    replace {system.root / 'boot' / f'initrd.img-{system.kernel}'}" in plan
    assert f"    replace {system.root / 'lib/modules' / system.kernel / 'modules.dep'}" in plan
    assert "    options amdgpu rdna1_quirks=0x3" in plan
    assert_same_system(before, system.hash())
    assert tree_digest(system.state) == state_before  # not even a lock file
    assert tree_digest(system.pristine.trees.dkms) == dkms_before

    rb = system.rollback("--dry-run")
    assert rb.returncode == 0 and "nothing installed by rdna1-kmgr" in rb.stdout


def test_rollback_dry_run_prints_the_undo_plan_and_changes_nothing(system):
    assert system.install().returncode == 0
    installed = system.hash()
    journal_before = tree_digest(system.state)
    proc = system.rollback("--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    undo = [line.strip() for line in lines if line.strip().startswith("undo ")]
    assert undo == ["undo initramfs:", "undo modprobe-conf:", "undo depmod:", "undo dkms-install:"]
    assert f"remove {system.root / 'etc/modprobe.d/rdna1-kmgr.conf'} (if present)" in [ln.strip() for ln in lines]
    assert any(line.strip().startswith("dkms remove -m rdna1-amdgpu") for line in lines)
    assert_same_system(installed, system.hash())
    assert tree_digest(system.state) == journal_before
    assert system.rollback().returncode == 0


# --- crashes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["dkms-install", "depmod", "modprobe-conf", "initramfs", "verify"])
def test_install_killed_after_each_step_is_rolled_back_exactly(system, step):
    before = system.hash()
    proc = system.install(env={jr.ABORT_ENV: step})
    assert proc.returncode == 137, proc.stderr
    assert "commit" not in system.journal_kinds()
    status = json.loads(system.cli("status", "--json", *system.cert_args).stdout)
    assert [k["journal"]["state"] for k in status["kernels"] if k["kernel"] == system.kernel] == ["install unfinished"]
    refused = system.install()
    assert refused.returncode == 6
    assert "did not finish" in one_error_line(refused) and "rollback" in refused.stderr

    proc = system.rollback()
    assert proc.returncode == 0, proc.stderr
    assert_same_system(before, system.hash())
    assert system.journal_kinds() == []


def test_install_killed_inside_a_step_is_rolled_back_exactly(system):
    """SIGKILL while update-initramfs runs: the step's intent is on disk, its `done` is not."""
    before = system.hash()
    proc = system.popen(
        "install", "--kernel", system.kernel, "--yes", *system.cert_args, env={"RDNA1_KMGR_TEST_INITRAMFS_SLEEP": "30"}
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kinds = system.journal_kinds()
            if kinds[-1:] == ["intent"] and len(kinds) >= 8:  # begin, 3 x (intent, done), intent
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"install did not reach the initramfs step: {system.journal_kinds()}")
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the install and the update-initramfs it runs
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    proc = system.rollback()
    assert proc.returncode == 0, proc.stderr
    assert "undo initramfs (it was interrupted)" not in proc.stdout  # said in the plan, not the result
    assert_same_system(before, system.hash())


@pytest.mark.parametrize(
    "point",
    ["undo-initramfs", "undo-modprobe-conf", "undo-depmod", "undo-dkms-install", "remove-package", "final-depmod"],
)
def test_rollback_killed_mid_way_then_run_again_restores_everything(system, point):
    before = system.hash()
    assert system.install().returncode == 0
    proc = system.rollback(env={jr.ABORT_ENV: point})
    assert proc.returncode == 137, proc.stderr
    status = json.loads(system.cli("status", "--json", *system.cert_args).stdout)
    assert [k["journal"]["state"] for k in status["kernels"] if k["kernel"] == system.kernel] == ["rollback unfinished"]
    proc = system.rollback()
    assert proc.returncode == 0, proc.stderr
    assert_same_system(before, system.hash())
    assert system.dkms_states() == []
    again = system.rollback()  # idempotent: nothing left to do
    assert again.returncode == 0 and "nothing installed" in again.stdout


# --- two runs at once ----------------------------------------------------------------------------------------------


def test_two_concurrent_installs_one_refuses_naming_the_other(system):
    first = system.popen(
        "install", "--kernel", system.kernel, "--yes", *system.cert_args, env={"RDNA1_KMGR_TEST_INITRAMFS_SLEEP": "4"}
    )
    try:
        deadline = time.monotonic() + 60
        while "intent" not in system.journal_kinds() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = system.install()
    finally:
        out, err = first.communicate(timeout=120)
    assert second.returncode == 7
    line = one_error_line(second)
    assert f"pid {first.pid}" in line and f"rdna1-kmgr install --kernel {system.kernel}" in line
    assert first.returncode == 0, err
    assert system.resolves_to() == system.installed_path
    assert system.rollback().returncode == 0


# --- a failing step rolls itself back --------------------------------------------------------------------------------


def test_a_failing_step_is_rolled_back_at_once(system):
    before = system.hash()
    proc = system.install(env={"RDNA1_KMGR_TEST_INITRAMFS_FAIL": "1"})
    assert proc.returncode == 4, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "install failed at initramfs" in last and "rolled back" in last
    assert_same_system(before, system.hash())
    assert system.journal_kinds() == []
    assert system.dkms_states() == [(system.pristine.package.version, "built")]  # the build is kept


def test_an_initramfs_that_would_load_another_amdgpu_fails_verification_and_is_rolled_back(system):
    before = system.hash()
    proc = system.install(env={"RDNA1_KMGR_TEST_INITRAMFS_STALE": "1"})
    assert proc.returncode == 5, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "install failed at verify" in last
    assert f"resolves amdgpu to lib/modules/{system.kernel}/kernel/{AMD_TREE}/amdgpu/amdgpu.ko" in last
    assert_same_system(before, system.hash())


# --- bad inputs: one line, non-zero, nothing changed -------------------------------------------------------------


def _unchanged(fs: FakeSystem):
    return fs.hash(), tree_digest(fs.pristine.trees.dkms), tree_digest(fs.pristine.trees.source)


def test_bad_inputs_each_give_one_line_and_change_nothing(system, tmp_path):
    before = _unchanged(system)
    (tmp_path / "other-keys").mkdir()
    other = make_keys(tmp_path / "other-keys", subject="another key")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [
        (["install", "--kernel", "../../etc", "--yes"], {}, 2, "invalid kernel release"),
        (
            ["install", "--kernel", "6.1.0-99-amd64", "--yes", *system.cert_args],
            {},
            8,
            "no rdna1-amdgpu build for kernel 6.1.0-99-amd64",
        ),
        (["install", "--kernel", system.kernel, "--yes", "--cert", str(other.cert)], {}, 8, "is not validly signed"),
        (
            ["install", "--kernel", system.kernel, "--yes", *system.cert_args],
            {"RDNA1_KMGR_STATE": str(blocker / "state")},
            4,
            "a-file is not a folder",  # refused by the check of the tool's roots
        ),
        (["install", "--kernel", system.kernel, *system.cert_args], {}, 2, "not confirmed"),  # no --yes, no terminal
        (["rollback", "--kernel", "6.1/../x", "--yes"], {}, 2, "invalid kernel release"),
    ]
    for args, env, code, message in cases:
        proc = system.cli(*args, env=env)
        assert proc.returncode == code, (args, proc.stderr)
        assert message in one_error_line(proc), args
        assert _unchanged(system) == before, args
    assert not (blocker / "state").exists()


def test_no_verdict_refuses(system):
    (system.state / "validations" / f"{system.pristine.module_sha256}.json").unlink()
    before = _unchanged(system)
    proc = system.install()
    assert proc.returncode == 8
    line = one_error_line(proc)
    assert "there is no VM verdict for this module" in line and "rdna1-kmgr vm-test" in line
    assert _unchanged(system) == before


def test_a_verdict_for_another_module_refuses(system):
    (system.state / "validations" / f"{system.pristine.module_sha256}.json").unlink()
    system.write_verdict(sha256="ab" * 32)
    before = _unchanged(system)
    proc = system.install()
    assert proc.returncode == 8
    assert "there is no VM verdict for this module" in one_error_line(proc)
    assert _unchanged(system) == before
    # A record under our name that names another module, or another kernel, is no verdict for this one either.
    record = system.state / "validations" / f"{system.pristine.module_sha256}.json"
    data = verdict_record("cd" * 32, system.kernel).to_json()
    record.write_text(json.dumps(data))
    assert "names another module" in one_error_line(system.install())
    data = verdict_record(system.pristine.module_sha256, "6.1.0-1-amd64").to_json()
    record.write_text(json.dumps(data))
    assert "is for kernel 6.1.0-1-amd64" in one_error_line(system.install())
    record.write_text("{not json")
    assert "unreadable" in one_error_line(system.install())
    assert _unchanged(system) == before


def test_a_failing_verdict_refuses_and_skip_vm_check_goes_on_loudly_and_records_it(system):
    system.write_verdict(result="fail")
    before = _unchanged(system)
    proc = system.install()
    assert proc.returncode == 8
    assert "its VM verdict is fail" in one_error_line(proc)
    assert _unchanged(system) == before

    proc = system.install("--skip-vm-check", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: --skip-vm-check: installing WITHOUT a passing VM verdict" in proc.stderr
    assert json.loads(proc.stdout)["vm_check"]["skipped"] is True
    begin = json.loads((system.state / "journal" / system.kernel / "journal.jsonl").read_text().splitlines()[0])
    assert begin["vm_check"]["skipped"] is True and "fail" in begin["vm_check"]["why"]
    assert "WITHOUT a passing VM verdict" in system.cli("status", *system.cert_args).stdout
    assert system.rollback().returncode == 0
    assert _unchanged(system)[0] == before[0]


def test_secure_boot_without_the_certificate_enrolled_refuses_with_the_enroll_steps(system):
    FakeSysroot(system.root).efi(secure_boot=True)
    before = _unchanged(system)
    proc = system.install()
    assert proc.returncode == 8
    line = one_error_line(proc)
    assert "Secure Boot is on" in line and "rdna1-kmgr keys enroll" in line and "MOK" in line
    assert _unchanged(system) == before


def test_a_corrupted_journal_is_refused_by_install_rollback_and_status(system):
    assert system.install().returncode == 0
    path = system.state / "journal" / system.kernel / "journal.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    (number,) = [n for n, line in enumerate(lines) if '"kind":"intent"' in line and '"step":"depmod"' in line]
    lines[number] = lines[number].replace('"command":["depmod"', '"command":["rm","-rf","/"', 1)  # tampered
    path.write_text("".join(lines))
    before = _unchanged(system)
    for command in (system.install, system.rollback):
        proc = command()
        assert proc.returncode == 6
        line = one_error_line(proc)
        assert f"is corrupted at line {number + 1}" in line and "nothing was changed" in line
        assert _unchanged(system) == before
    status = json.loads(system.cli("status", "--json", *system.cert_args).stdout)
    assert [k["journal"]["state"] for k in status["kernels"] if k["kernel"] == system.kernel] == ["corrupted"]


def test_another_module_where_ours_would_go_is_not_overwritten(system):
    foreign = system.installed_path
    foreign.parent.mkdir(parents=True)
    shutil.copy2(system.stock_path, foreign)
    before = _unchanged(system)
    proc = system.install()
    assert proc.returncode == 8 and "not from rdna1-kmgr" in one_error_line(proc)
    assert _unchanged(system) == before


def test_our_own_build_installed_behind_the_journals_back_is_named(system):
    """DKMS 3.0.10 autoinstalls any package whose AUTOINSTALL is non-empty when a kernel package is installed."""
    args = [
        "install",
        "-m",
        dkms.PACKAGE_NAME,
        "-v",
        system.pristine.package.version,
        "-k",
        system.kernel,
        "--force",
        "--no-depmod",
        *system.pristine.trees.cli_args(),
        f"--installtree={system.root}/lib/modules",
    ]
    subprocess.run(["dkms", *args], check=True, capture_output=True)
    before = _unchanged(system)
    proc = system.install()
    assert proc.returncode == 8
    line = one_error_line(proc)
    assert "was installed for" in line and "outside rdna1-kmgr" in line
    assert f"dkms uninstall -m rdna1-amdgpu -v {system.pristine.package.version} -k {system.kernel}" in line
    assert _unchanged(system) == before


def test_a_kernel_without_its_modules_or_headers_is_refused(system):
    """(Headers alone are enough: test_a_kernel_whose_image_is_not_installed_gets_the_module_and_no_initramfs.)"""
    shutil.rmtree(system.root / "lib/modules" / system.kernel / "kernel")
    (system.root / "lib/modules" / system.kernel / "modules.order").unlink()
    (system.root / "lib/modules" / system.kernel / "build").unlink()
    before = _unchanged(system)
    proc = system.install()
    assert proc.returncode == 8 and f"install its image package (linux-image-{system.kernel})" in one_error_line(proc)
    assert _unchanged(system) == before


def test_rollback_with_nothing_installed_says_so(system):
    for args in ([], ["--kernel", system.kernel]):
        proc = system.cli("rollback", "--yes", *args)
        assert proc.returncode == 0, proc.stderr
        assert "nothing installed by rdna1-kmgr" in proc.stdout
    assert not (system.state / "lock").exists()


# --- replacing one build by another ----------------------------------------------------------------------------------


def test_installing_a_newer_build_replaces_the_installed_one(system):
    before = system.hash()
    assert system.install().returncode == 0
    workdir = system.root.parent / "newer"
    workdir.mkdir()
    newer = build_standin(workdir, system.kernel, system.pristine.trees, system.pristine.keys, "v2")
    newer_sha = jr.sha256_file(dkms.built_module(newer, system.kernel, system.pristine.trees))
    system.write_verdict(sha256=newer_sha)
    plan = system.install("--dry-run").stdout
    assert "first undo the install now in place:" in plan
    proc = system.install("--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["package_version"] == newer.version
    assert jr.sha256_file(system.resolves_to()) == newer_sha
    states = dict(system.dkms_states())
    assert states == {newer.version: "installed"}  # the replaced build is gone
    assert system.rollback().returncode == 0
    assert_same_system(before, system.hash())


def test_a_modprobe_conf_of_our_name_that_we_did_not_write_is_refused(system):
    conf = system.root / "etc/modprobe.d/rdna1-kmgr.conf"
    conf.write_text("options amdgpu dc=0\n")  # someone's own file under our name
    before = system.hash()
    proc = system.install()
    assert proc.returncode == 8
    assert "was not written by rdna1-kmgr" in one_error_line(proc)
    assert_same_system(before, system.hash())


# --- the real thing: amdgpu for Debian's 6.1 kernel, installed into that kernel -----------------------------------


@dataclass
class RealSystem:
    kernel: str
    built: dict
    state: Path
    env: dict
    baseline: dict

    def cli(self, *args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLI), *args], capture_output=True, text=True, env={**self.env, **(env or {})}, timeout=timeout
        )

    def hash(self) -> dict:
        return system_hash(Path("/"), self.kernel)

    def journal_kinds(self) -> list[str]:
        """The kinds of the journal's records, but for `program` (one per program a step started)."""
        path = self.state / "journal" / self.kernel / "journal.jsonl"
        kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()] if path.exists() else []
        return [kind for kind in kinds if kind != "program"]

    def dkms_state(self) -> str | None:
        for entry in dkms.status(dkms.PACKAGE_NAME, dkms.Trees()):
            if entry.version == self.built["package_version"] and entry.kernel == self.kernel:
                return entry.state
        return None


@pytest.fixture(scope="module")
def real(built_module_61, tmp_path_factory) -> Iterator[RealSystem]:
    kernel = built_module_61["kernel"]
    installed_here = ensure_image_installed(kernel)
    state = tmp_path_factory.mktemp("real-state")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RDNA1_KMGR_ROOT", "RDNA1_KMGR_DKMS_TREE", "RDNA1_KMGR_DKMS_SOURCE_TREE", jr.ABORT_ENV)
    }
    env["RDNA1_KMGR_STATE"] = str(state)
    saved = os.environ.get("RDNA1_KMGR_STATE")
    os.environ["RDNA1_KMGR_STATE"] = str(state)
    try:
        # The verdict `vm-test` would store for this module (the vm-test suite proves that part).
        verdict.write(verdict_record(built_module_61["sha256"], kernel))
    finally:
        if saved is None:
            os.environ.pop("RDNA1_KMGR_STATE")
        else:
            os.environ["RDNA1_KMGR_STATE"] = saved
    system = RealSystem(kernel, built_module_61, state, env, {})
    assert system.dkms_state() == "built", "the 6.1 build is installed already: roll it back by hand first"
    system.baseline = system.hash()
    assert system.baseline["initramfs"], f"/boot/initrd.img-{kernel} should exist with the image package"
    yield system
    # A failed test must not leave this machine installed for the next run (CI reuses the machine): roll back
    # whatever the tests' journal still holds. A no-op when every test cleaned up after itself.
    done = system.cli("rollback", "--kernel", kernel, "--yes", "--keep-build")
    assert done.returncode == 0, done.stderr
    if installed_here:
        purge_image(kernel, tmp_path_factory.mktemp("purge"))


@pytest.mark.realbuild
def test_real_install_resolves_to_the_built_module_refuses_a_second_run_and_rolls_back_exactly(real):
    stock = modinfo_resolves(real.kernel)
    assert "/kernel/drivers/gpu/drm/amd/amdgpu/" in str(stock)

    dry = real.cli("install", "--kernel", real.kernel, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"4. initramfs: update-initramfs -c -k {real.kernel} -b /boot" in dry.stdout
    assert_same_system(real.baseline, real.hash())

    first = subprocess.Popen(
        [str(CLI), "install", "--kernel", real.kernel, "--yes", "--json"],
        env=real.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while real.journal_kinds().count("intent") < 4 and time.monotonic() < deadline:  # in update-initramfs
            time.sleep(0.2)
        second = real.cli("install", "--kernel", real.kernel, "--yes")
    finally:
        out, err = first.communicate(timeout=900)
    assert second.returncode == 7
    assert f"pid {first.pid}" in one_error_line(second)
    assert first.returncode == 0, err
    result = json.loads(out)

    installed = modinfo_resolves(real.kernel)
    assert installed.parent == Path(f"/lib/modules/{real.kernel}/updates/dkms")
    changed = real.hash()
    assert all(changed[part] != real.baseline[part] for part in changed)  # the hash sees all three parts move
    assert jr.sha256_file(installed) == real.built["sha256"] == result["verified"]["sha256"]
    module_checks.verify_signature(installed, Path(real.built["certificate"]))
    assert "etc/modprobe.d/rdna1-kmgr.conf" in initramfs_list(Path(f"/boot/initrd.img-{real.kernel}"))
    assert real.dkms_state() == "installed"
    status = json.loads(real.cli("status", "--json").stdout)
    (k,) = [k for k in status["kernels"] if k["kernel"] == real.kernel]
    assert k["module"]["sha256"] == real.built["sha256"] and k["module"]["signature"]["valid"] is True
    assert k["journal"]["state"] == "installed"

    # A rollback killed half way, then run again.
    killed = real.cli(
        "rollback", "--kernel", real.kernel, "--yes", "--keep-build", env={jr.ABORT_ENV: "undo-modprobe-conf"}
    )
    assert killed.returncode == 137, killed.stderr
    done = real.cli("rollback", "--kernel", real.kernel, "--yes", "--keep-build")
    assert done.returncode == 0, done.stderr
    assert_same_system(real.baseline, real.hash())
    assert modinfo_resolves(real.kernel) == stock
    assert real.dkms_state() == "built"


@pytest.mark.realbuild
@pytest.mark.parametrize("step", ["dkms-install", "depmod", "modprobe-conf", "initramfs", "verify"])
def test_real_install_killed_after_each_step_is_rolled_back_exactly(real, step):
    killed = real.cli("install", "--kernel", real.kernel, "--yes", env={jr.ABORT_ENV: step})
    assert killed.returncode == 137, killed.stderr
    assert real.journal_kinds()[-1] == "done" and "commit" not in real.journal_kinds()
    done = real.cli("rollback", "--kernel", real.kernel, "--yes", "--keep-build")
    assert done.returncode == 0, done.stderr
    assert_same_system(real.baseline, real.hash())
    assert real.dkms_state() == "built"
