"""Journals that are not a kernel's: one folder each under journal/, named for what it holds.

    journal/profile/      the installed user-space profile (install/user_profile.py)
    journal/experiment/   the experiment's kernel-cell boots (experiment/boot_cells.py): its GRUB script,
                          defaults file and unit, until the last cell ran or `experiment stop`
    journal/parameters/   kernel parameters the experiment's answer added to every boot
                          (install/kernel_parameters.py)

The same records, backups and replay as a kernel's journal (journal.py, rollback.py); `Journal.kernels()`
skips these folders because their names are no kernel release.
"""

from __future__ import annotations

from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.files import make_dirs, write_atomic
from rdna1_kmgr.install import grub_commands
from rdna1_kmgr.install.journal import Journal, journal_root
from rdna1_kmgr.install.journal_records import Done
from rdna1_kmgr.install.undo import Writer, regenerate

# The files the profile's and the parameter's journals write (install/user_profile.py,
# install/kernel_parameters.py), relative to the target root; here, so journal_checks knows them too.
PROFILE_ENVIRONMENT_D = "etc/environment.d/90-rdna1-kmgr.conf"
PROFILE_PROFILE_D = "etc/profile.d/rdna1-kmgr.sh"
PARAMETER_DEFAULTS = "etc/default/grub.d/rdna1-kmgr.parameters.cfg"


class NamedJournal(Journal):
    NAME = ""

    def __init__(self):  # noqa: super().__init__ would check NAME as a kernel release
        self.kernel = self.NAME
        self.dir = journal_root() / self.NAME
        self.path = self.dir / "journal.jsonl"
        self.backups = self.dir / "backups"


class ProfileJournal(NamedJournal):
    NAME = "profile"


class ExperimentJournal(NamedJournal):
    NAME = "experiment"


class ParameterJournal(NamedJournal):
    NAME = "parameters"


def missing_parents(path: Path) -> list[Path]:
    """The folders above `path` that do not exist yet, nearest first (a step records them to remove them)."""
    missing = []
    folder = path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing


def write_files(journal: Journal, files: dict[Path, bytes], after: list[list[str]] | None = None) -> list[str]:
    """Each file a journal step (a backup first, the folders it creates), written durably; `after` runs once
    at the end and again on undo, after the files are restored (what regenerates from them: GRUB's commands,
    grub_commands)."""
    said = []
    for path, data in files.items():
        step = f"write {path}"
        journal.record_intent(
            step,
            None,
            replaces=[path],
            dirs=missing_parents(path),
            undo=regenerate(Writer.FILES, after) if after else None,
        )
        make_dirs(path.parent)
        write_atomic(path, data, 0o644)
        journal.append(Done(step))
        said.append(f"wrote {path}")
    hint = "the files are written; `rdna1-kmgr rollback` undoes them"
    grub_commands.run(after or [], lambda command: runner.run(command, timeout=900, error=HostError, hint=hint))
    return said + [" ".join(command) for command in after or []]
