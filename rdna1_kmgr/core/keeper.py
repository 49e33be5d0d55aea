"""Programs die with rdna1-kmgr, however it ends: the keeper, and telling a program's session from a stranger's.

Every program the runner starts leads a session of its own (so a timeout stops make's children too), which
also means nothing stops them when the tool itself is killed: SIGKILL, the OOM killer, a closed terminal run
no Python code. The kernel does two things for a dead process whatever killed it: it closes its files, and it
sends a child its "parent death signal" (PR_SET_PDEATHSIG, the runner sets it). The second reaches only the
direct child (update-initramfs, not the mkinitramfs under it; dkms, not its cp or make), and fires when the
*thread* that started it ends. So the runner also starts this keeper once: a small process in a session of its
own (a signal to the tool's process group does not reach it) reading a pipe that only the tool can write to.
The tool sends `+ <session> <start time>` (with the read ends of the program's output pipes) when a program
starts and `- <session>` when it is done; when the channel reaches its end the tool is gone, and the keeper
stops what is still listed, whole session, SIGTERM (so mkinitramfs and dkms run their own clean-up traps) then
SIGKILL.

If the keeper is killed too, the journal holds the same ids and the next run stops them
(install/journal_programs.py).

pid_max is 32768 on many machines: a pid is soon reused. A session is named by its leader's pid and that
leader's start time (clock ticks since boot, /proc/PID/stat field 22), within one boot (its boot id). Linux
keeps a pid number allocated while any process still has it as its session or group id, so a live process
with the leader's pid but another start time means the recorded session is entirely gone.

Stdlib only, and runnable as a script (`python -I -S keeper.py`): the keeper starts in milliseconds and does
not import the package.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger("rdna1_kmgr.runner")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_listeners: list = []  # reporting_starts' listeners, innermost last
_prctl = None

# Seconds between SIGTERM and SIGKILL. Longer than the runner's 3 s for a timeout: no one waits on a dead
# tool, and mkinitramfs's exit trap removing its working tree (a whole module set) took more than 3 s on a
# loaded 2-core machine, leaving it in /var/tmp when SIGKILL came first.
GRACE = 10.0
_POLL = 0.05


def boot_id() -> str:
    """This boot's id: start times only compare within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces and parentheses: split after the last one.
    return stat[stat.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks after boot), or None when there is no such process."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def session_members(session: int) -> list[int]:
    """Live (not zombie) processes whose session id is `session`, from /proc."""
    return [pid for pid, _ in _members(session)]


def _members(session: int) -> list[tuple[int, int]]:
    """(pid, start time) of the live processes of `session`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and int(fields[3]) == session and fields[0] not in ("Z", "X"):
            found.append((int(entry.name), int(fields[19])))
    return found


def still_running(session: int, started: int, boot: str | None = None) -> list[int]:
    """The live processes of the session whose leader had pid `session` and started at `started` (in the boot
    `boot`, None: this one). Empty when that session is over, or its pid now names someone else's."""
    if boot is not None and boot != boot_id():
        return []
    leader = start_time(session)
    if leader is not None and leader != started:
        return []  # the pid was free, so the recorded session had ended: this is another process
    # A member cannot have started before its session's leader did.
    return [pid for pid, since in _members(session) if since >= started]


def stop_sessions(
    sessions: list[tuple[int, int]], grace: float = GRACE, wait: float = 10.0, drain: Callable[[], None] = lambda: None
) -> list[int]:
    """Stop each recorded (session, start time) still running: SIGTERM to its group and members, SIGKILL to
    what is left after `grace`, until none is left or `wait` runs out (`drain` called while it waits). The
    sessions that were running."""
    running = [(s, t) for s, t in sessions if still_running(s, t)]
    _signal(running, signal.SIGTERM)
    _signal(running, signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs again
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(still_running(s, t) for s, t in running):
        drain()
        time.sleep(_POLL)
    deadline = time.monotonic() + wait
    while any(still_running(s, t) for s, t in running) and time.monotonic() < deadline:
        _signal(running, signal.SIGKILL)
        drain()
        time.sleep(_POLL)
    return [s for s, _ in running]


def _signal(sessions: list[tuple[int, int]], sig: int) -> None:
    for session, started in sessions:
        # The group first (one call reaches make's whole tree at once), then any member that left it.
        members = still_running(session, started)
        if members:
            try:
                os.killpg(session, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in members:
            _signal_pinned(pid, session, started, sig)


def _signal_pinned(pid: int, session: int, started: int, sig: int) -> None:
    """Signal `pid` through a pidfd: once the fd is open the pid cannot name another process, so the check
    made after opening it (still in `session`, started with or after its leader) holds when the
    signal goes; os.kill after a check could reach a process that got the pid in between."""
    try:
        pinned = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        fields = _stat(pid)
        if fields and int(fields[3]) == session and int(fields[19]) >= started:
            signal.pidfd_send_signal(pinned, sig)
    except OSError:
        pass
    finally:
        os.close(pinned)


# --- the runner's side -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """A program the runner started, named so that a later run can tell it from a process that got its pid."""

    session: int  # its pid, which is also its session and process group id
    start_time: int  # clock ticks after boot (/proc/PID/stat field 22)
    boot_id: str
    argv: tuple[str, ...]


_libc_prctl = None


@contextmanager
def reporting_starts(listener: Callable[[Started], None]) -> Iterator[None]:
    """Within the block, `listener` hears of each program the runner starts, right after it starts (a journaled
    run records it). Nested blocks: the innermost listener alone hears (a rollback inside an install records
    into the journal it replays). A listener that raises stops the program it was told of."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def stop_left_over(programs: list[Started]) -> list[Started]:
    """Stop, whole session, the programs of `programs` (an earlier run's) that still run; those it stopped."""
    running = [p for p in programs if still_running(p.session, p.start_time, p.boot_id)]
    stopped = set(stop_sessions([(p.session, p.start_time) for p in running], grace=GRACE))
    for program in running:
        log.info("stopped %s (session %d), left running by an earlier run", shlex.join(program.argv), program.session)
    return [p for p in running if p.session in stopped]


def report(started: Started) -> None:
    """Tell the innermost `reporting_starts` listener, if any, of a program the runner started."""
    if _listeners:
        _listeners[-1](started)


def dies_with(parent: int) -> Callable[[], None]:
    """The child's first act, between fork and exec: the kernel sends it SIGTERM when the thread that started it
    ends, however it ends (SIGTERM, not SIGKILL: update-initramfs and dkms get to run their clean-up traps)."""
    global _prctl
    if _prctl is None:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the tool died between fork and prctl: the signal would never come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def main() -> None:
    # The keeper outlives the tool on purpose, if only for a moment: no terminal signal may end it first.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    # fd 0 is a SOCK_SEQPACKET socket: one message per program, with the read ends of its output pipes. Once
    # the tool is gone the keeper is their reader: a program writing to a pipe no one reads dies of SIGPIPE
    # before its clean-up trap runs (mkinitramfs left its working tree in /var/tmp so).
    channel = socket.socket(fileno=0)
    listed: dict[int, tuple[int, list[int]]] = {}
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 256, 8)
        if not message:
            break  # the tool has ended, however it ended (the kernel closed its end)
        fields = message.split()
        if len(fields) == 3 and fields[0] == b"+":
            listed[int(fields[1])] = (int(fields[2]), fds)
        elif len(fields) == 2 and fields[0] == b"-":
            for fd in listed.pop(int(fields[1]), (0, []))[1]:
                os.close(fd)
    outputs = [fd for _, fds in listed.values() for fd in fds]
    for fd in outputs:
        os.set_blocking(fd, False)

    def drain() -> None:
        for fd in outputs:
            try:
                while os.read(fd, 65536):
                    pass
            except OSError:  # nothing there now (EAGAIN)
                pass

    stop_sessions([(session, since) for session, (since, _) in listed.items()], drain=drain)


if __name__ == "__main__":
    main()
