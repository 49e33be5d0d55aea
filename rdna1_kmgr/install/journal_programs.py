"""The programs a journaled run starts, recorded in its journal, and stopped by the next run if still alive.

The runner ties every program to the tool's life (core/keeper.py); this is the net under that net, for when
the keeper was killed too: update-initramfs or dkms running on as orphans would write /boot and /lib/modules
after rollback had restored them. Each program's `program` record (session id, start time, boot id, command
line) is on disk right after it starts; a run that takes the lock stops, whole session, every recorded program
still running before it changes or undoes anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rdna1_kmgr.core import runner
from rdna1_kmgr.install.journal import Journal


@contextmanager
def recorded(journal: Journal) -> Iterator[None]:
    """Within the block, each program the runner starts gets a `program` record in `journal`."""

    def record(started: runner.Started) -> None:
        journal.append(
            "program",
            session=started.session,
            start_time=started.start_time,
            boot_id=started.boot_id,
            argv=list(started.argv),
        )

    with runner.reporting_starts(record):
        yield


def stop_left_over(journal: Journal) -> list[str]:
    """Stop the programs an earlier run recorded in `journal` that still run; one line for each."""
    programs = [
        runner.Started(r["session"], r["start_time"], r["boot_id"], tuple(r["argv"]))
        for r in journal.records()
        if r["kind"] == "program"
    ]
    return [
        f"stopped {' '.join(p.argv[:4])}{' ...' if len(p.argv) > 4 else ''} (session {p.session}), "
        "left running by an earlier run that was killed"
        for p in runner.stop_left_over(programs)
    ]
