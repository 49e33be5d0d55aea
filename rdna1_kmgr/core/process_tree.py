"""A program's process tree, under the runner (core/runner.py): how it starts, and how it is stopped whole.

`start` puts a program in a session of its own, so a timeout or Ctrl-C stops the whole tree (make's children,
QEMU under vng), not only the first process: `stop` signals the process group, then `sweep`s /proc for anything
left in the session, and returns only once none of it is running.

Programs also die with the tool, even a SIGKILLed one (core/keeper.py says how). A journaled run hears of each
program (`reporting_starts`) to record its ids; `stop_left_over` stops what a killed run left running.

`as_user` runs a program as the owner: the one place the tool drops root (`_as_owner`).

Only the runner calls `start`; with it, this is the only module that starts programs (tests/core/test_layout.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from rdna1_kmgr.core import keeper, keeper_link, program_env
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.owner import Owner
from rdna1_kmgr.core.program_path import located

_POLL = 0.1  # seconds between looks at what is left of a session
_GRACE = 3.0  # seconds between SIGTERM and SIGKILL: lets QEMU or make say why it stops

session_members = keeper.session_members
# What a journaled run uses to record its programs and stop an earlier run's (core/keeper.py). Started on a line
# of its own: a plain `Name = Class` is a type alias to mypy, a tuple assignment is not.
Started = keeper.Started
reporting_starts, stop_left_over = keeper.reporting_starts, keeper.stop_left_over


# --- programs die with the tool ---------------------------------------------------------------------------


def start(argv: list[str], as_user: Owner | None = None, **popen) -> subprocess.Popen:
    """Popen in a session of its own, tied to this process's life: its parent death signal, the keeper, and
    whoever `reporting_starts` asked. `env`: what the program needs beyond the allow-list of
    core/program_env.py, the only variables of this process's it gets. `as_user`: it runs as that user
    (`_as_owner`), and `env` is then its whole environment, made from program_env.for_owner()."""
    keeper_link.ensure(_start_keeper)  # before the program: a tool killed right after the fork still has its keeper
    if as_user is not None:
        popen.update(_as_owner(as_user, popen.get("env")))
    else:  # root's programs: the allow-list and what the caller named for this one (core/program_env.py)
        popen["env"] = program_env.for_program(popen.get("env"))
    argv = located(argv, popen.get("env"))
    proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=keeper.dies_with(os.getpid()), **popen)
    started = Started(proc.pid, keeper.start_time(proc.pid) or 0, keeper.boot_id(), tuple(argv))
    keeper_link.track(
        _start_keeper,
        started.session,
        started.start_time,
        [f.fileno() for f in (proc.stdout, proc.stderr) if f is not None],
    )
    try:
        keeper.report(started)
    except BaseException:
        stop(proc)  # it would run unrecorded
        raise
    return proc


_KEEPER_POPEN = subprocess.Popen


def _start_keeper(channel: int) -> subprocess.Popen:
    """The keeper (core/keeper.py), reading the channel `channel` is its end of, in a session of its own."""
    # Through the saved Popen: the keeper is not one of the programs a caller asked for (tests count those).
    return _KEEPER_POPEN(
        [sys.executable, "-I", "-S", keeper.__file__],
        stdin=channel,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def ended(session: int) -> None:
    """The program is done; once nothing is left in its session, the keeper need not stop it."""
    if keeper_link.listed(session) and not session_members(session):
        keeper_link.track(_start_keeper, session, None)


# --- stopped whole ----------------------------------------------------------------------------------------


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL after a grace period, then sweep the session."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=_GRACE)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    sweep(proc.pid)
    proc.wait()
    ended(proc.pid)


def sweep(session: int, wait: float = 5.0) -> None:
    """SIGKILL every process still in `session` and wait until none is left running."""
    deadline = time.monotonic() + wait
    while True:
        left = session_members(session)
        if not left or time.monotonic() >= deadline:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(_POLL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --- the owner's programs ---------------------------------------------------------------------------------

# What says who a process is or where root's session lives: the owner's program gets the owner's (or none).
_IDENTITY = {"HOME", "USER", "LOGNAME", "PATH", "SHELL", "MAIL", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"}


def _as_owner(owner: Owner, env: dict[str, str] | None) -> dict:
    """Popen's arguments that run a program as `owner`: their uid, gid and groups (set in the child before it
    runs anything; its parent death signal is set after, as a change of user clears it), and a clean
    environment: the caller's `env` (else program_env.for_owner()) less what names root, plus the owner's HOME,
    USER, LOGNAME and PATH. The one place the tool drops root."""
    given = program_env.for_owner() if env is None else env
    clean = {k: v for k, v in given.items() if k not in _IDENTITY and not k.startswith("SUDO_")}
    clean.update(owner.environment())
    if os.geteuid() == owner.uid:
        return {"env": clean}
    if os.geteuid() != 0:
        raise HostError(f"cannot run a program as {owner.name}: this process is not root and not {owner.name}")
    return {"env": clean, "user": owner.uid, "group": owner.gid, "extra_groups": owner.groups()}
