"""rdna1_kmgr.core.process_tree: a program's process tree starts in a session of its own, is reported to a
journaled run's listener, is stopped whole (even a part that ignores SIGTERM), and runs as the owner only with
the owner's identity. Real processes; the session runs through core/runner.py are in test_runner.py."""

import os
import pwd
import signal
import subprocess
import time

import pytest

from rdna1_kmgr.core import process_tree
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.owner import Owner


def started(script: str) -> subprocess.Popen:
    """sh running `script` through process_tree.start, once it printed its first line (it set itself up)."""
    proc = process_tree.start(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (proc(5)): the clock ticks after boot at which the process started."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def test_a_program_leads_a_session_of_its_own():
    proc = started("echo ready; sleep 5")  # short: a stop that cannot find the session waits it out
    session, group = os.getsid(proc.pid), os.getpgid(proc.pid)
    process_tree.stop(proc)
    assert session == group == proc.pid and session != os.getsid(0)


@pytest.mark.system  # a killed process tree, waited for: seconds
def test_stop_ends_the_whole_tree_even_a_part_that_ignores_sigterm():
    proc = started("trap '' TERM; sleep 300 & sleep 300 & echo ready; wait")
    assert len(process_tree.session_members(proc.pid)) == 3  # sh and its two sleeps
    began = time.monotonic()
    process_tree.stop(proc)
    assert time.monotonic() - began >= process_tree._GRACE  # SIGTERM first, and the grace waited out
    assert proc.returncode == -signal.SIGKILL
    assert process_tree.session_members(proc.pid) == []


def test_sweep_kills_what_a_finished_program_left_in_its_session():
    proc = started("(sleep 300 &); echo ready")
    proc.wait()
    left = process_tree.session_members(proc.pid)
    assert len(left) == 1
    # the subshell's fork becomes sleep when it execs, which a loaded machine may not have done yet
    deadline = time.monotonic() + 10
    while open(f"/proc/{left[0]}/comm").read() != "sleep\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open(f"/proc/{left[0]}/comm").read() == "sleep\n"
    process_tree.sweep(proc.pid)
    process_tree.ended(proc.pid)
    assert process_tree.session_members(proc.pid) == []


def test_a_journaled_run_hears_of_each_program_with_the_ids_that_name_it():
    heard = []
    with process_tree.reporting_starts(heard.append):
        proc = started("echo ready; sleep 300")
    try:
        assert len(heard) == 1
        program = heard[0]
        assert program.session == proc.pid and program.start_time == start_time(proc.pid)
        assert open("/proc/sys/kernel/random/boot_id").read().strip() == program.boot_id
        assert os.path.basename(program.argv[0]) == "sh" and program.argv[1:] == ("-c", "echo ready; sleep 300")
    finally:
        process_tree.stop(proc)


# --- the owner's programs ----------------------------------------------------------------------------------

# What a caller may hand the owner's program: root's identity and session, and a variable of its own.
ROOTS_ENV = {
    "HOME": "/root",
    "USER": "root",
    "PATH": "/usr/sbin:/usr/bin",
    "XDG_RUNTIME_DIR": "/run/user/0",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus",
    "SUDO_USER": "owner",
    "SUDO_COMMAND": "/bin/sh",
    "HSA_OVERRIDE_GFX_VERSION": "10.3.0",
}


def test_the_owners_program_gets_the_owners_identity_and_nothing_of_roots(monkeypatch):
    """This process is the owner already: no change of user, only the environment (a Debian user's PATH,
    /etc/profile's)."""
    monkeypatch.setattr(process_tree.os, "geteuid", lambda: 1000)
    owner = Owner("alice", 1000, 1000, "/home/alice")
    assert process_tree._as_owner(owner, ROOTS_ENV) == {
        "env": {
            "HSA_OVERRIDE_GFX_VERSION": "10.3.0",
            "HOME": "/home/alice",
            "USER": "alice",
            "LOGNAME": "alice",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
        }
    }


def test_root_runs_the_owners_program_as_the_owners_uid_gid_and_groups(monkeypatch):
    monkeypatch.setattr(process_tree.os, "geteuid", lambda: 0)
    nobody = pwd.getpwnam("nobody")
    owner = Owner("nobody", nobody.pw_uid, nobody.pw_gid, nobody.pw_dir)
    arguments = process_tree._as_owner(owner, None)
    assert (arguments["user"], arguments["group"]) == (nobody.pw_uid, nobody.pw_gid)
    assert nobody.pw_gid in arguments["extra_groups"]
    assert arguments["env"]["USER"] == "nobody" and "SUDO_USER" not in arguments["env"]


def test_a_user_who_is_not_root_cannot_run_a_program_as_another(monkeypatch):
    monkeypatch.setattr(process_tree.os, "geteuid", lambda: 1000)
    with pytest.raises(HostError, match="cannot run a program as bob: this process is not root and not bob"):
        process_tree._as_owner(Owner("bob", 1001, 1001, "/home/bob"), {})
