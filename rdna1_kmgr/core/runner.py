"""Run a program in a session of its own, under a hard time limit, and leave none of its processes behind.

A VM run is a tree of processes (vng, then virtme-run, then qemu-system-x86_64); killing only the first
would leave QEMU spinning. The program starts a new session, so every descendant shares its session id
unless it makes a session of its own (none of these do); stopping means signalling the process group, then
sweeping /proc for anything left in the session.
"""

from __future__ import annotations

import os
import select
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
    session: int  # the session id the run had (its first process's pid)


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

    The output goes through a pipe that this process copies to `output`, not straight to the file:
    QEMU reopens /proc/self/fd/1 for its console with O_TRUNC, which would cut a file back to zero.
    """
    started = time.monotonic()
    with open(output, "wb") as sink:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, cwd=cwd, start_new_session=True,
        )
        pipe = proc.stdout
        os.set_blocking(pipe.fileno(), False)

        def pump(wait: float) -> tuple[bool, bool]:
            """Copy what the pipe holds to the file: (got something, `watch` asks to stop)."""
            ready, _, _ = select.select([pipe], [], [], wait)
            data = pipe.read() if ready else None
            if not data:
                return False, False
            sink.write(data)
            sink.flush()
            return True, watch is not None and watch(data.decode(errors="replace"))

        def drain() -> None:
            while pump(0)[0]:
                pass

        def end(returncode, timed_out=False, stopped_early=False) -> Outcome:
            drain()
            pipe.close()
            return Outcome(returncode, timed_out, stopped_early, time.monotonic() - started, proc.pid)

        try:
            while True:
                code = proc.poll()
                _, enough = pump(_POLL)
                if enough:
                    stop(proc)
                    return end(None, stopped_early=True)
                if code is not None:
                    sweep(proc.pid)  # a child may outlive its parent (and hold the pipe open)
                    return end(code)
                if time.monotonic() - started >= timeout:
                    stop(proc)
                    return end(None, timed_out=True)
        except BaseException:
            stop(proc)
            pipe.close()
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
