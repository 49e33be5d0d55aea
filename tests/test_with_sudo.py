"""A normal user who types `sudo rdna1-kmgr ...`, as the README says to.

sudo resets the environment (secure_path for PATH, HOME of root), so this is a different run from a root
shell's: the command must be on sudo's path, and nothing may land in the user's home owned by root (a
classic of tools that cache under $HOME). A scratch user with a NOPASSWD sudoers entry runs, from its home,
the read-only commands and the --dry-run of every command that changes the system. Both the user and the
sudoers entry are gone afterwards. sudo itself is installed by `install.sh --test`.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

USER = "rdna1kmgr-sudo-test"
SUDOERS = Path("/etc/sudoers.d/rdna1kmgr-sudo-test")
CLI = Path(sys.executable).parent / "rdna1-kmgr"
ON_SUDO_PATH = Path("/usr/local/bin/rdna1-kmgr")  # and on the user's own PATH


@pytest.fixture
def sudo_user():
    if os.geteuid() != 0:
        pytest.skip("creates a user and a sudoers entry: root only")
    if not shutil.which("sudo"):
        pytest.fail("sudo is not installed: `./install.sh --test` installs it for this test")
    if not ON_SUDO_PATH.exists() or ON_SUDO_PATH.resolve() != CLI.resolve():
        pytest.skip(f"{ON_SUDO_PATH} is not this venv's command (install.sh places it; here it runs from {CLI})")
    subprocess.run(["userdel", "-r", USER], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
    SUDOERS.write_text(f"{USER} ALL=(root) NOPASSWD: ALL\n")
    SUDOERS.chmod(0o440)
    try:
        subprocess.run(["visudo", "-c", "-q", "-f", str(SUDOERS)], check=True)
        yield Path(f"/home/{USER}")
    finally:
        SUDOERS.unlink(missing_ok=True)
        subprocess.run(["userdel", "-r", USER], capture_output=True)


def as_user(home: Path, *args: str) -> subprocess.CompletedProcess:
    # runuser gives the user's own environment; the user then types `sudo -n rdna1-kmgr ...` in its home.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "USER": USER, "LANG": "C.UTF-8"}
    command = [shutil.which("runuser"), "-u", USER, "--", "sudo", "-n", "rdna1-kmgr", *args]
    return subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=900)


def test_a_normal_user_runs_every_command_with_sudo(sudo_user):
    home = sudo_user
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    version = as_user(home, "--version")
    assert version.returncode == 0 and version.stdout.startswith("rdna1-kmgr, version"), version.stderr
    for args in (
        ["detect", "--json"],
        ["status"],
        ["quirks"],
        ["build", "--dry-run"],
        ["install", "--dry-run"],
        ["rollback", "--dry-run"],
        ["keys", "status"],
    ):
        run = as_user(home, *args)
        # A refusal (no build to install yet, no board) is one line and a documented code, never a traceback.
        assert run.returncode in (0, 4, 5, 8), f"{args}: {run.stderr}"
        assert "Traceback" not in run.stderr, f"{args}: {run.stderr}"
        if run.returncode:
            assert run.stderr.strip().splitlines()[-1].startswith("rdna1-kmgr: "), f"{args}: {run.stderr}"
    # The user's home is as it was: nothing written there as root.
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    assert not [p for p in home.rglob("*") if p.stat().st_uid == 0]


def test_a_normal_user_asks_for_the_install_plan_without_sudo(sudo_user):
    """`rdna1-kmgr install --dry-run` as the user: a dry run writes nothing, so it needs no root. It once refused
    (the journal's folder not writable; then dkms "not installed": Debian keeps the sbin folders off a user's
    PATH, so the tool adds them after the user's own; and the command was in /usr/local/sbin). By name, on
    Debian's PATH for a user."""
    home = sudo_user
    path = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"  # Debian's /etc/profile for a user
    env = {"PATH": path, "HOME": str(home), "USER": USER, "LANG": "C.UTF-8"}
    command = [shutil.which("runuser"), "-u", USER, "--", "sh", "-c", "rdna1-kmgr install --dry-run --skip-vm-check"]
    run = subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=900)
    assert "cannot keep the journal" not in run.stderr and "dkms is not installed" not in run.stderr, run.stderr
    assert run.returncode in (0, 4, 5, 8) and "Traceback" not in run.stderr, run.stderr
    if run.returncode == 0:
        assert "1. dkms-install: dkms install" in run.stdout, run.stdout
    assert not [p for p in home.rglob("*") if p.stat().st_uid == 0]
