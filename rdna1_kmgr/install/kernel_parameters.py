"""A stock amdgpu parameter on every boot's command line, journaled: how `experiment apply` keeps a kernel cell
that passed (`amdgpu.cwsr_enable=0`).

GRUB's defaults, not modprobe.d: the initramfs loads amdgpu before the root file system is mounted, and the
command line reaches it there and after, with no initramfs to regenerate per kernel.

    /etc/default/grub.d/rdna1-kmgr.parameters.cfg   GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX <word>"

One step in journal/parameters/ (backup first), then `update-grub`; `rollback` removes the file and runs
`update-grub` again.
"""

from __future__ import annotations

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.user_input import AMDGPU_PARAMETER
from rdna1_kmgr.install import boot_guard, rollback
from rdna1_kmgr.install.journal import locked, refuse_if_busy
from rdna1_kmgr.install.journal_records import Commit, ParameterBegin
from rdna1_kmgr.install.profile_journal import PARAMETER_DEFAULTS, ParameterJournal, write_files
from rdna1_kmgr.install.target_root import TargetRoot

DEFAULTS = PARAMETER_DEFAULTS


def file_text(word: str) -> bytes:
    return (
        f"# Written by `rdna1-kmgr experiment apply`; `rdna1-kmgr rollback` removes it: the kernel cell that\n"
        f'# passed on this board, on every boot.\nGRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {word}"\n'
    ).encode()


def install(word: str, dry_run: bool = False) -> dict:
    # The word comes back from the experiment's record and goes into a file update-grub sources as root: checked
    # again here, whoever wrote the record.
    if not AMDGPU_PARAMETER.fullmatch(word):
        raise UsageError(
            f"refusing the kernel parameter {word!r}: not one amdgpu parameter (amdgpu.NAME=NUMBER)",
            "run `rdna1-kmgr experiment kernel` again; nothing was changed",
        )
    root = TargetRoot.from_env()
    why = boot_guard.unavailable(root)
    if why:
        raise UsageError(f"a kernel parameter is added through GRUB, and {why}", "nothing was changed")
    refuse_if_busy()
    path = root.path / DEFAULTS
    journal = ParameterJournal()
    lines = ([f"first undo the parameter added before ({journal.path})"] if journal.exists() else []) + [
        f"{'replace' if path.exists() else 'create'} {path} (backed up in the journal first): "
        f"GRUB_CMDLINE_LINUX += {word}",
        "update-grub",
        f"journal: {journal.path}",
    ]
    if dry_run:
        return {"parameter": word, "dry_run": True, "plan": lines}
    said = []
    with locked(f"experiment apply {word}"):
        if journal.exists():
            said += rollback.replay(journal, keep_build=True, reason=f"replaced by {word}")
            journal = ParameterJournal()
        journal.begin(ParameterBegin(word))
        said += write_files(journal, {path: file_text(word)}, after=[["update-grub"]])
        journal.append(Commit())
    return {"parameter": word, "dry_run": False, "plan": lines, "done": said}
