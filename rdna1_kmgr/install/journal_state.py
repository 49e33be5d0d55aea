"""What a journal says happened: its records summed up, step by step (install/journal.py's `state`).

Read by rollback (what to undo), install (an unfinished run refuses it; is this very module in place?),
modprobe_conf and follow (the installs in place), status and the profile's status.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import (
    Begin,
    Commit,
    Done,
    Entry,
    HandedOver,
    Intent,
    Rollback,
    RolledBack,
    Undone,
)


@dataclass
class StepState:
    """One intent of the journal (its seq and step), whether the step finished, whether a rollback reversed it."""

    seq: int
    step: str
    intent: Intent  # with the backups handed over to it since (summarize)
    done: bool = False
    undone: bool = False


@dataclass
class State:
    """What a journal says happened."""

    begin: Begin | None
    since: str | None = None  # when it began
    steps: list[StepState] = field(default_factory=list)
    committed: bool = False
    rollback_started: bool = False
    rolled_back: bool = False

    @property
    def description(self) -> str:
        if self.rolled_back:
            return "rolled back"
        if self.rollback_started:
            return "rollback unfinished"
        if self.committed:
            return "installed"
        return "install unfinished"

    @property
    def install(self) -> InstallBegin | None:
        """What the journal's install began with (None: not an install's journal, or not begun)."""
        return self.begin.begun if self.begin and isinstance(self.begin.begun, InstallBegin) else None

    @property
    def in_place(self) -> InstallBegin | None:
        """The install, when it finished and no rollback started since."""
        return self.install if self.committed and not self.rollback_started else None


def summarize(entries: list[Entry]) -> State:
    state = State(begin=None)
    by_seq: dict[int, StepState] = {}
    for entry in entries:
        record = entry.record
        if isinstance(record, Begin) and state.begin is None:
            state.begin, state.since = record, entry.time
        elif isinstance(record, Intent):
            by_seq[entry.seq] = StepState(entry.seq, record.step, record)
            state.steps.append(by_seq[entry.seq])
        elif isinstance(record, Done):
            step = next((step for step in reversed(state.steps) if step.step == record.step), None)
            if step is not None:
                step.done = True
        elif isinstance(record, Commit):
            state.committed = True
        elif isinstance(record, Rollback):
            state.rollback_started = True
        elif isinstance(record, HandedOver) and record.of in by_seq:
            # one naming no earlier step is not applied; journal_checks refuses it before anything acts on the journal
            step, taken = by_seq[record.of], record.entry
            backups = tuple(taken if backup.path == taken.path else backup for backup in step.intent.backups)
            step.intent = dataclasses.replace(step.intent, backups=backups)
        elif isinstance(record, Undone) and record.of in by_seq:
            by_seq[record.of].undone = True
        elif isinstance(record, RolledBack):
            state.rolled_back = True
    return state
