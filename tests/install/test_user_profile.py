"""`profile install|remove`: the profile's files written journaled, read by a real shell, shown by status and
doctor, and undone by `rollback` down to the last byte of /etc. In a scratch root (RDNA1_KMGR_ROOT) and,
as root, once on this machine's own /etc."""

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from sysfs_fixtures import FakeSysroot

from rdna1_kmgr.install import user_profile
from rdna1_kmgr.userspace import profiles

CLI = str(Path(sys.executable).parent / "rdna1-kmgr")
SYSTEM_LOCK = Path("/work/locks/system.lock")


def etc_state(etc: Path) -> dict[str, str]:
    """Every entry under etc: type, mode and content hash or link target."""
    found = {}
    for folder, dirs, files in os.walk(etc):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            st = path.lstat()
            if path.is_symlink():
                found[str(path)] = f"link {os.readlink(path)}"
            elif path.is_dir():
                found[str(path)] = f"dir {st.st_mode & 0o7777:o}"
            else:
                found[str(path)] = f"file {st.st_mode & 0o7777:o} {hashlib.sha256(path.read_bytes()).hexdigest()}"
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
    return found


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A root with a lived-in /etc (an environment file, a profile.d script, no environment.d yet) and a
    state directory of its own."""
    root = tmp_path / "root"
    (root / "etc/profile.d").mkdir(parents=True)
    (root / "etc/environment").write_text('PATH="/usr/local/bin:/usr/bin:/bin"\n')
    (root / "etc/profile.d/locale.sh").write_text("export LANG=C.UTF-8\n")
    FakeSysroot(root).kernel(os.uname().release)  # status reads the root's kernel release
    env = {"RDNA1_KMGR_ROOT": str(root), "RDNA1_KMGR_STATE": str(tmp_path / "state")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return root


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def shell_environment(script: Path, start: dict[str, str]) -> dict[str, str]:
    """The environment a login shell has after sourcing `script`, starting from `start`."""
    out = subprocess.run(
        ["bash", "-c", f'. "{script}" && env -0'],
        capture_output=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", **start},
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def test_install_then_rollback_leaves_etc_bit_identical(scratch):
    before = etc_state(scratch / "etc")
    cli("profile", "install", "conv-gemm")
    profile = profiles.get("conv-gemm")

    shell = shell_environment(scratch / user_profile.PROFILE_D, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert "HSA_OVERRIDE_GFX_VERSION" not in shell
    # MIOpen reads only 0 as "off": the kept families are left unset, the naive fallback (direct) is kept
    assert profiles.SOLVER_PREFIX + "GEMM" not in shell and profiles.SOLVER_PREFIX + "DIRECT" not in shell
    for family in ("IMPLICIT_GEMM", "WINOGRAD", "FFT"):
        assert shell[profiles.SOLVER_PREFIX + family] == "0"
    env_d = (scratch / user_profile.ENVIRONMENT_D).read_text().splitlines()
    assert sorted(line for line in env_d if not line.startswith("#")) == sorted(
        f"{k}={v}" for k, v in profile.set.items()
    )

    status = json.loads(cli("status", "--json").stdout)["profile"]
    assert status["installed"] == "conv-gemm" and status["state"] == "installed"
    assert etc_state(scratch / "etc") != before

    rolled = cli("rollback", "--yes")
    assert "profile" in rolled.stdout
    assert etc_state(scratch / "etc") == before
    assert json.loads(cli("status", "--json").stdout)["profile"]["installed"] is None


def test_dry_run_prints_the_plan_and_changes_nothing(scratch, tmp_path):
    before = etc_state(scratch / "etc")
    plan = cli("profile", "install", "find-fast", "--dry-run").stdout
    assert f"create {scratch / user_profile.ENVIRONMENT_D}" in plan and "MIOPEN_FIND_MODE=FAST" in plan
    assert etc_state(scratch / "etc") == before and not (tmp_path / "state/journal").exists()


@pytest.mark.parametrize(
    "name,reason",
    [
        ("override-1030", "RDNA2 code on RDNA1 hardware"),
        ("small-bar", "no evidence it changes Conv2d"),
        ("no-svm", "reproduces the BO-backed CWSR failure with a stock driver"),
    ],
)
def test_experiment_controls_are_refused_with_their_reason(scratch, tmp_path, name, reason):
    before = etc_state(scratch / "etc")
    proc = cli("profile", "install", name, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert f"profile '{name}' is an experiment control" in proc.stderr and reason in proc.stderr
    offered = proc.stderr.split("install one of: ")[1]
    assert "override-1030" not in offered and "no-svm" not in offered
    assert etc_state(scratch / "etc") == before and not (tmp_path / "state").exists()
    assert "experiment only" in cli("profile", "list").stdout


def test_a_second_install_replaces_the_first_and_one_rollback_restores_the_original(scratch):
    (scratch / user_profile.PROFILE_D).write_text("# the owner's own file of that name\nexport X=1\n")
    before = etc_state(scratch / "etc")
    cli("profile", "install", "conv-gemm")
    cli("profile", "install", "no-override")
    assert (scratch / user_profile.PROFILE_D).read_text().startswith(f"{user_profile.MARK}no-override:")
    cli("profile", "remove")
    assert etc_state(scratch / "etc") == before


def test_doctor_checks_the_installed_profile(scratch):
    cli("profile", "install", "no-winograd")
    assert user_profile.status()["installed"] == "no-winograd"
    from rdna1_kmgr.doctor import profile_check

    found = profile_check.findings(scratch, None)
    assert [f.level for f in found] == ["ok"] and "no-winograd" in found[0].seen
    (scratch / user_profile.ENVIRONMENT_D).unlink()  # changed by hand
    assert profile_check.findings(scratch, None)[0].level == "warn"


def test_an_unknown_profile_is_one_error_line_and_nothing_changes(scratch, tmp_path):
    before = etc_state(scratch / "etc")
    proc = cli("profile", "install", "turbo", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("rdna1-kmgr: error: unknown profile 'turbo': choose one of: ")
    assert etc_state(scratch / "etc") == before and not (tmp_path / "state").exists()


@contextmanager
def system_lock():
    if not SYSTEM_LOCK.parent.is_dir():
        yield
        return
    with open(SYSTEM_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def test_on_this_machines_etc(tmp_path, monkeypatch):
    """The real /etc: install, a login shell picks it up, rollback, and /etc/environment.d and
    /etc/profile.d are as before (the journal lives in a scratch state directory)."""
    if os.geteuid() != 0:
        pytest.skip("writing /etc needs root")
    monkeypatch.delenv("RDNA1_KMGR_ROOT", raising=False)
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    with system_lock():
        if (Path("/") / user_profile.PROFILE_D).exists() or (Path("/") / user_profile.ENVIRONMENT_D).exists():
            pytest.skip("this machine already has an rdna1-kmgr profile installed")
        before = {d: etc_state(Path(d)) for d in ("/etc/environment.d", "/etc/profile.d")}
        had_env_d = Path("/etc/environment.d").exists()
        try:
            cli("profile", "install", "conv-direct")
            login = subprocess.run(
                ["bash", "-lc", "echo $MIOPEN_DEBUG_CONV_GEMM/$MIOPEN_DEBUG_CONV_DIRECT"],
                capture_output=True,
                text=True,
                env={"PATH": "/usr/bin:/bin", "HOME": "/root"},
            )
            assert login.stdout.strip() == "0/"
        finally:
            cli("rollback", "--yes")
        assert {d: etc_state(Path(d)) for d in before} == before
        assert Path("/etc/environment.d").exists() == had_env_d


def test_install_warns_of_a_shell_file_that_sets_what_the_profile_sets(scratch):
    """An `export` in a shell file runs after /etc/profile.d: the owner is told to edit that line."""
    (scratch / "etc/profile.d/zz-rocm.sh").write_text("export HSA_OVERRIDE_GFX_VERSION=10.3.0\n")
    plan = cli("profile", "install", "conv-gemm", "--dry-run").stdout
    assert "warning: /etc/profile.d/zz-rocm.sh:1 sets HSA_OVERRIDE_GFX_VERSION=10.3.0" in plan
    assert "edit that line" in plan
    home = scratch / "home/owner"
    home.mkdir(parents=True)
    (home / ".bashrc").write_text("alias ll='ls -l'\nexport MIOPEN_FIND_MODE=NORMAL\n")
    find_fast = user_profile.shell_conflicts(profiles.get("find-fast"), scratch, home)
    assert any(
        w.startswith("warning: /home/owner/.bashrc:2 sets MIOPEN_FIND_MODE=NORMAL") for w in find_fast
    ), find_fast
    (home / ".bashrc").write_text("export MIOPEN_FIND_MODE=FAST\n")  # the same value: nothing to warn of
    assert not [w for w in user_profile.shell_conflicts(profiles.get("find-fast"), scratch, home) if ".bashrc" in w]
