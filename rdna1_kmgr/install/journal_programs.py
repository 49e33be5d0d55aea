"""The programs a journaled run starts, recorded in its journal, and stopped by the next run if still alive.

The runner ties every program to the tool's life (core/process_tree.py, core/keeper.py); this is the net under
that net, for when the keeper was killed too: update-initramfs or dkms running on as orphans would write /boot
and /lib/modules after rollback had restored them. Each program's `program` record (session id, start time,
boot id, command line) is on disk right after it starts; a run that takes the lock stops, whole session, every
recorded program still running before it changes or undoes anything.

A record is acted on only when it can be one of ours (journal_checks.program_problem: a program a journaled
run starts) and the process at its pid can be the one recorded: same boot, same start time, running one of
those programs, as the user this tool runs as. A process at that pid that started *before* the recorded
start time held the pid when the record says another process got it: the record is false, and refused.
One that started after it got the pid once the recorded program ended: left alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rdna1_kmgr.core import keeper, process_tree
from rdna1_kmgr.install import journal_checks
from rdna1_kmgr.install.journal import Journal
from rdna1_kmgr.install.journal_records import Program

# What a recorded program may have become by exec: update-grub ends in `exec grub-mkconfig`.
_EXECS_INTO = frozenset({"grub-mkconfig"})
_INTERPRETERS = frozenset({"sh", "dash", "bash", "perl", "python3"})


@contextmanager
def recorded(journal: Journal) -> Iterator[None]:
    """Within the block, each program the runner starts gets a `program` record in `journal`."""

    def record(started: process_tree.Started) -> None:
        journal.append(Program(started.session, started.start_time, started.boot_id, tuple(started.argv)))

    with process_tree.reporting_starts(record):
        yield


def stop_left_over(journal: Journal) -> list[str]:
    """Stop the programs an earlier run recorded in `journal` that still run; one line for each. A record that
    cannot be ours is refused (journal_checks.RecordRefused) before anything is stopped."""
    programs = []
    for entry in journal.records():
        if not isinstance(entry.record, Program):
            continue
        record = entry.record
        problem = journal_checks.program_problem(record) or not_the_recorded_program(record)
        if problem:
            raise journal_checks.refused(journal, entry, problem)
        programs.append(process_tree.Started(record.session, record.start_time, record.boot_id, record.argv))
    return [
        f"stopped {' '.join(p.argv[:4])}{' ...' if len(p.argv) > 4 else ''} (session {p.session}), "
        "left running by an earlier run that was killed"
        for p in process_tree.stop_left_over(programs)
    ]


def not_the_recorded_program(record: Program) -> str | None:
    """Why the live process at the record's pid cannot be the program recorded (None: it is, or none runs)."""
    session, recorded_start = record.session, record.start_time
    if record.boot_id != keeper.boot_id():
        return None  # an earlier boot's: nothing of it runs now
    live = keeper.start_time(session)
    if live is None or live > recorded_start:
        return None  # it ended; its pid is free, or another process got it since (left alone)
    if live < recorded_start:
        return (
            f"names pid {session} as started at {recorded_start}, but the process there has run since {live}: "
            "not a program rdna1-kmgr started"
        )
    running = _program_name(session)
    # None: a leader that exited and was not reaped (its parent, the killed run, is gone) has no command line
    # any more, while its children may still run: the owner check below is all there is to go on.
    if running is not None and running not in journal_checks.PROGRAMS | _EXECS_INTO:
        return f"names pid {session}, which runs {running}, not a program rdna1-kmgr started"
    try:
        owner = os.stat(f"/proc/{session}").st_uid
    except OSError:
        return None  # it ended just now
    if owner != os.geteuid():
        return f"names pid {session}, which runs as uid {owner}, not as this tool"
    return None


def _program_name(pid: int) -> str | None:
    """The program a process runs, by its command line: a script's name rather than its interpreter's."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return None
    if not argv:
        return None
    if os.path.basename(argv[0]) in _INTERPRETERS:
        scripts = [a for a in argv[1:] if not a.startswith("-")]
        return os.path.basename(scripts[0]) if scripts else None
    return os.path.basename(argv[0])
