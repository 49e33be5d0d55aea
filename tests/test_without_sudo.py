"""A fresh Debian logged in as root may have no sudo at all: install.sh and the tool must never call it.

`sudo` is shadowed on PATH by a stub that records the call and fails; install.sh runs for real (apt-get,
a venv, pip) into a scratch prefix and command folder, then the installed command runs the read-only and
--dry-run paths of every command that changes the system. The stub must never have been called.
"""

import os
import subprocess
from pathlib import Path

import pytest
from install_checks import restore_hooks, snapshot_hooks

# real dkms, apt/dpkg, a CPU PyTorch or killed process trees on fixtures: seconds each, out of the fast tier
pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_sudo(tmp_path) -> tuple[dict[str, str], Path]:
    """An environment whose `sudo` is a failing stub that leaves a mark when called."""
    stubs, mark = tmp_path / "stubs", tmp_path / "sudo-was-called"
    stubs.mkdir()
    (stubs / "sudo").write_text(f'#!/bin/sh\necho "sudo $*" >> {mark}\necho "sudo: command not found" >&2\nexit 127\n')
    (stubs / "sudo").chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
    return env, mark


def test_the_stub_stands_in_for_sudo(no_sudo):
    env, mark = no_sudo
    proc = subprocess.run(["sh", "-c", "sudo true"], env=env, capture_output=True, text=True)
    assert proc.returncode == 127 and mark.read_text() == "sudo true\n"


def test_install_sh_and_the_tool_run_as_root_without_sudo(no_sudo, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("install.sh installs system packages: root only")
    env, mark = no_sudo
    # a copy of the checkout: pip leaves a build/ folder in what it installs from
    source = tmp_path / "src"
    subprocess.run(["cp", "-a", str(REPO), str(source)], check=True)
    env = {**env, "RDNA1_KMGR_PREFIX": str(tmp_path / "prefix"), "RDNA1_KMGR_BIN": str(tmp_path / "bin")}
    # install.sh places the kernel and apt hooks for its prefix: the machine's own come back afterwards,
    # or they would call this scratch prefix's command once it is gone.
    saved_hooks = snapshot_hooks()
    checkout = sorted(os.listdir(source))
    try:
        proc = subprocess.run([str(source / "install.sh")], env=env, capture_output=True, text=True, timeout=1800)
    finally:
        placed = (
            Path("/etc/apt/apt.conf.d/80rdna1-kmgr").read_text()
            if Path("/etc/apt/apt.conf.d/80rdna1-kmgr").exists()
            else ""
        )
        restore_hooks(saved_hooks)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cli = tmp_path / "bin" / "rdna1-kmgr"
    assert cli.resolve() == tmp_path / "prefix" / "bin" / "rdna1-kmgr"
    assert "install.sh: done: rdna1-kmgr, version" in proc.stdout
    assert sorted(os.listdir(source)) == checkout  # no build/ or *.egg-info left in the checkout
    assert str(tmp_path / "prefix" / "bin" / "rdna1-kmgr") in placed  # its hooks called its own command

    state = {"RDNA1_KMGR_STATE": str(tmp_path / "state"), "RDNA1_KMGR_LOG": str(tmp_path / "log")}
    for args in (
        ["--version"],
        ["detect", "--json"],
        ["status"],
        ["quirks"],
        ["build", "--dry-run"],
        ["install", "--dry-run"],
        ["rollback", "--dry-run"],
        ["keys", "status"],
    ):
        run = subprocess.run([str(cli), *args], env={**env, **state}, capture_output=True, text=True, timeout=600)
        # refusals are fine here (no build yet to install); what matters is that nothing asks for sudo
        assert run.returncode in (0, 4, 5, 8), f"{args}: {run.stderr}"
        assert "sudo" not in run.stderr, f"{args}: {run.stderr}"
    assert not mark.exists(), f"sudo was called: {mark.read_text()}"
