"""The files several kernels' installs share, when one of those kernels is removed.

The boot guard's and the stock loader's files serve every kernel. A later install (follow's, for a new kernel)
backs them up as the earlier one left them, and rollback undoes the newest install first, so each gets back what
it found (rollback.py). When a kernel package is removed, `follow removed` drops that kernel's journal without
undoing it: its module index and initramfs went with the package. Its backups of the shared files must not go
with it, or no rollback could return those files to what was there before the installs:

- the next later install that backed up the same file takes the removed install's backup as its own (a
  `handed-over` record in that journal, the backup copied there first): undoing it returns the file to what the
  removed install found;
- when no later install backed it up, none relies on what the removed install wrote there: the removed
  install's step is undone now as rollback undoes it (the file as the install found it, an earlier install's
  version or absent, and what regenerates from it: GRUB's configuration without the guard).

The modprobe.d file is not one of these: it is rewritten for the kernels left (modprobe_conf.sync).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.install import rollback
from rdna1_kmgr.install.journal import Journal
from rdna1_kmgr.install.journal_records import Backup
from rdna1_kmgr.install.journal_state import StepState


@dataclass(frozen=True)
class SharedFile:
    """A file the removed kernel's install wrote that is not that kernel's own."""

    entry: Backup  # the removed install's backup of it: the file as that install found it
    step: int  # the removed install's step that backed it up first (its intent's seq)
    later: Journal | None = None  # the next install that backed it up again, which takes the backup
    later_step: int | None = None  # that install's step

    @property
    def path(self) -> str:
        return self.entry.path


def _first_backups(journal: Journal, own: Callable[[Path], bool]) -> dict[str, tuple[Backup, int]]:
    """Each shared file's first backup in `journal` (what the install found), with its step, for the steps not
    undone."""
    found: dict[str, tuple[Backup, int]] = {}
    for step in journal.state().steps:
        if not step.undone:
            for entry in reversed(rollback.restored(step)):
                if not own(Path(entry.path)):
                    found.setdefault(entry.path, (entry, step.seq))
    return found


def of_removed(journal: Journal, own: Callable[[Path], bool]) -> list[SharedFile]:
    """The shared files `journal`'s install wrote (`own` tells the kernel's own files, which go with it), each
    with the later install that takes its backup."""
    newest_first = rollback.kernel_journals_newest_first()
    kernels = [j.kernel for j in newest_first]
    if journal.kernel not in kernels:
        return []
    # each later install's steps read once, oldest install first: the first to back a path up takes its backup
    later_steps = [
        (other, step)
        for other in newest_first[: kernels.index(journal.kernel)][::-1]
        for step in other.state().steps
        if not step.undone
    ]
    shared = []
    for path, (entry, seq) in _first_backups(journal, own).items():
        taker = next(
            ((other, step.seq) for other, step in later_steps if any(b.path == path for b in rollback.restored(step))),
            None,
        )
        shared.append(SharedFile(entry, seq, *taker) if taker else SharedFile(entry, seq))
    return shared


def _steps_to_undo(journal: Journal, shared: list[SharedFile]) -> list[StepState]:
    """The removed install's steps whose files are all shared and none wanted by a later install: undone whole."""
    kept = {s.path for s in shared if s.later is None}
    return [
        step
        for step in journal.state().steps
        if not step.undone and rollback.restored(step) and all(entry.path in kept for entry in rollback.restored(step))
    ]


def plan(journal: Journal, shared: list[SharedFile]) -> list[str]:
    to_undo = _steps_to_undo(journal, shared)
    undone = {step.seq for step in to_undo}
    lines = [
        f"  hand the backup of {s.path} to {s.later.kernel}'s later install, which wrote it again"
        for s in shared
        if s.later
    ]
    lines += [f"  undo {step.step}: no later install wrote its files again" for step in to_undo]
    lines += [
        f"  put {s.path} back as the install found it" for s in shared if s.later is None and s.step not in undone
    ]
    return lines


def release(journal: Journal, shared: list[SharedFile]) -> list[str]:
    """Hand each backup over, or undo what no later install relies on; what was done. Before `journal` is archived
    (its backups go with it)."""
    said = []
    for s in shared:
        if s.later is not None and s.later_step is not None:
            s.later.hand_over(s.later_step, s.entry, journal.backups)
            said.append(f"handed the backup of {s.path} to {s.later.kernel}'s later install")
    undone = set()
    for step in reversed(_steps_to_undo(journal, shared)):  # newest first, as rollback undoes
        said += rollback.UndoStep(step).run(journal)
        undone.add(step.seq)
    said += [journal.restore(s.entry) for s in shared if s.later is None and s.step not in undone]
    return said
