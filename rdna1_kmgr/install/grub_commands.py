"""GRUB's commands (update-grub, grub-editenv), run so that GRUB reads what they wrote.

GRUB reads grub.cfg and its environment block at power-on with its own ext4 reader, which does not replay the
file system's journal. So after the commands, the journal of the file system they wrote is checkpointed
(core/files.checkpoint_journal); otherwise a power cut could leave GRUB booting by the old files while the
kernel sees the new ones. The power-cut test found exactly that: a first boot after `install` that GRUB
started without the boot guard. Every writer of GRUB's files runs its commands through `run`: the boot guard,
the experiment's kernel-cell boots, the kernel parameter's update-grub, and their undo.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rdna1_kmgr.core.files import checkpoint_journal

# Where update-grub writes grub.cfg (Debian's and Ubuntu's GRUB)
GRUB_FOLDER = Path("/boot/grub")


def written_folders(commands: Sequence[Sequence[str]]) -> list[Path]:
    """The folders the commands write: a grub-editenv's block's, update-grub's grub.cfg's."""
    return sorted({Path(c[1]).parent if c[0] == "grub-editenv" else GRUB_FOLDER for c in commands})


def run(commands: Sequence[Sequence[str]], run_one: Callable[[list[str]], object]) -> None:
    """Each command through `run_one` (the caller's error and hint), then the journal checkpointed where they
    wrote, before the caller records the step done."""
    for command in commands:
        run_one(list(command))
    for folder in written_folders(commands):
        checkpoint_journal(folder)
