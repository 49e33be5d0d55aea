"""rdna1_kmgr.core.keeper: a left-over program is signalled only while its pid still names it.

The attack the pidfd closes: between the check that a pid belongs to a session the tool started and the signal,
the program ends and its pid goes to another process (someone else's, or root's). The check is made after the
pidfd pins the pid, and a pid that now names a process of another session, or a process that started before the
recorded leader (so it cannot be one of its children), is left alone. Real processes, real signals.
"""

import os
import signal
import subprocess
import time

from rdna1_kmgr.core import keeper


def _alive(proc: subprocess.Popen) -> bool:
    time.sleep(0.2)
    return proc.poll() is None


def test_a_pid_that_now_names_another_sessions_process_is_not_signalled():
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the process that got the pid
    try:
        started = keeper.start_time(victim.pid)
        assert started is not None
        # the record names the pid, but its session was another one (the tool's, now gone)
        keeper._signal_pinned(victim.pid, victim.pid + 100_000, started, signal.SIGTERM)
        assert _alive(victim)
        # the record's leader started after this process did: the pid is not the one recorded
        keeper._signal_pinned(victim.pid, victim.pid, started + 1, signal.SIGTERM)
        assert _alive(victim)
        # the pid still names what the record says: signalled
        keeper._signal_pinned(victim.pid, os.getsid(victim.pid), started, signal.SIGTERM)
        assert victim.wait(timeout=10) == -signal.SIGTERM
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_a_pid_that_is_gone_is_no_error():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    keeper._signal_pinned(proc.pid, proc.pid, 0, signal.SIGTERM)  # reaped: pidfd_open fails, nothing is signalled
