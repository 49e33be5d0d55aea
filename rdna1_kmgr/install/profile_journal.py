"""The journal of the installed user-space profile: one, not per kernel, under journal/profile/.

The same records, backups and replay as a kernel's journal (journal.py, rollback.py); `Journal.kernels()`
skips its folder because "profile" is no kernel release.
"""

from __future__ import annotations

from rdna1_kmgr.install.journal import Journal, journal_root

NAME = "profile"


class ProfileJournal(Journal):
    def __init__(self):  # noqa: super().__init__ would check NAME as a kernel release
        self.kernel = NAME
        self.dir = journal_root() / NAME
        self.path = self.dir / "journal.jsonl"
        self.backups = self.dir / "backups"
