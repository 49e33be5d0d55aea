"""Run a program in a session of its own, under a hard time limit, and leave none of its processes behind.

A VM run is a tree of processes (vng, then virtme-run, then qemu-system-x86_64); killing only the first
would leave QEMU spinning. The program starts a new session, so every descendant shares its session id
unless it makes a session of its own (none of these do); stopping means signalling the process group, then
sweeping /proc for anything left in the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_POLL = 0.1
_GRACE = 3.0  # seconds between SIGTERM and SIGKILL: lets QEMU say why it stops


@dataclass(frozen=True)
class Outcome:
    returncode: int | None  # None when it was stopped
    timed_out: bool
    stopped_early: bool  # `watch` asked to stop
    elapsed: float


def run(
    argv: list[str],
    output: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    watch: Callable[[str], bool] | None = None,
) -> Outcome:
    """Run argv with stdout and stderr into `output`; kill its whole session after `timeout` seconds.

    `watch` gets every new chunk of output as it arrives; when it returns True the run is stopped there
    (a probe that has seen enough). Ctrl-C stops the session too, then goes on up.
    """
    started = time.monotonic()
    with open(output, "wb") as sink, open(output, "rb") as source:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            env=env, cwd=cwd, start_new_session=True,
        )
        try:
            while True:
                code = proc.poll()
                chunk = source.read().decode(errors="replace")
                if chunk and watch is not None and watch(chunk):
                    stop(proc)
                    return Outcome(None, False, True, time.monotonic() - started)
                if code is not None:
                    sweep(proc.pid)  # a child may outlive its parent
                    return Outcome(code, False, False, time.monotonic() - started)
                if time.monotonic() - started >= timeout:
                    stop(proc)
                    return Outcome(None, True, False, time.monotonic() - started)
                time.sleep(_POLL)
        except BaseException:
            stop(proc)
            raise


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


def session_members(session: int) -> list[int]:
    """Live (not zombie) processes whose session id is `session`, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after its closing parenthesis.
        fields = stat[stat.rindex(")") + 2 :].split()
        state, sid = fields[0], int(fields[3])
        if sid == session and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
