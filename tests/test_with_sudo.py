"""A normal user who types `sudo rdna1-kmgr ...`, as the README says to.

sudo resets the environment (secure_path for PATH, HOME of root), so this is a different run from a root
shell's: the command must be on sudo's path, and nothing may land in the user's home owned by root (a
classic of tools that cache under $HOME). A scratch user with a NOPASSWD sudoers entry runs, from its home,
the read-only commands and the --dry-run of every command that changes the system. Both the user and the
sudoers entry are gone afterwards. sudo itself is installed by `install.sh --test`.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# a real user through the real sudo: out of the fast tier
pytestmark = pytest.mark.system

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


@pytest.fixture
def roots_state():
    """A state folder as an install leaves /var/lib/rdna1-kmgr: its parents open to all, itself root's alone."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as top:
        Path(top).chmod(0o755)
        yield Path(top) / "state"


def test_a_normal_user_without_sudo_gets_doctor_and_one_line_from_status(sudo_user, roots_state):
    """The owner runs `doctor` as themself; the state an install leaves is root's alone (0700: its journals,
    the profile's too). doctor reads what it can and says what it could not; status, which needs that state,
    says in one line to run it with sudo. Both once ended in a PermissionError traceback (Debian 13 newcomer run)."""
    home, state = sudo_user, roots_state
    for journal in ("journal/6.12.118+deb13-amd64", "journal/profile"):
        (state / journal).mkdir(parents=True)
        (state / journal / "journal.jsonl").write_text("")
    for folder in [state, *state.rglob("*")]:
        folder.chmod(0o700 if folder.is_dir() else 0o600)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "USER": USER, "LANG": "C.UTF-8"}
    env["RDNA1_KMGR_STATE"] = str(state)

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [shutil.which("runuser"), "-u", USER, "--", "env", *[f"{k}={v}" for k, v in env.items()]]
        return subprocess.run([*command, str(CLI), *args], cwd=home, capture_output=True, text=True, timeout=900)

    doctor = run("doctor", "--json")
    assert "Traceback" not in doctor.stderr, doctor.stderr
    (profile,) = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "profile"]
    assert profile["facts"]["journaled"].startswith("not read (root's alone"), profile
    status = run("status")
    assert status.returncode == 4 and "Traceback" not in status.stderr, status.stderr
    (line,) = status.stderr.strip().splitlines()
    assert line.startswith(f"rdna1-kmgr: error: permission denied: {state / 'journal'}"), line
    assert line.endswith("run `sudo rdna1-kmgr status`"), line
    # the read-only commands and the dry runs either work or say to run the same command line with sudo, flags
    # included: an owner who types the hint of `rollback --dry-run` must not get a rollback
    for args in (["install", "--dry-run"], ["rollback", "--dry-run"], ["report"], ["status", "--json"]):
        done = run(*args)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        if done.returncode:
            last = done.stderr.strip().splitlines()[-1]
            assert last.endswith(f"run `sudo rdna1-kmgr {' '.join(args)}`"), (args, last)
