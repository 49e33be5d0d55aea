"""Journals that are not a kernel's: one folder each under journal/, named for what it holds.

    journal/profile/      the installed user-space profile (install/user_profile.py)
    journal/experiment/   the experiment's kernel-cell boots (experiment/boot_cells.py): its GRUB script,
                          defaults file and unit, until the last cell ran or `experiment stop`

The same records, backups and replay as a kernel's journal (journal.py, rollback.py); `Journal.kernels()`
skips these folders because their names are no kernel release.
"""

from __future__ import annotations

from rdna1_kmgr.install.journal import Journal, journal_root


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
