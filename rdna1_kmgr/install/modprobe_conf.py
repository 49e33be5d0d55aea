"""/etc/modprobe.d/rdna1-kmgr.conf: one file every kernel reads, so no single kernel's install owns it.

modprobe.d has no per-kernel section: the file applies to every kernel on the machine (and every initramfs
copies it). Its content is therefore derived from all kernels that have a finished install, never restored
from one kernel's backup: each install and each rollback rewrites it for the kernels installed after that
change, and the rollback of the last one removes it. `rollback --kernel A` then leaves kernel B's line in
place, whatever order the kernels were installed and rolled back in.

Why a stale copy cannot do harm: the options line only states what each installed module does by default
anyway (a build's `rdna1_quirks` defaults to the quirks it was rendered with). When the installed kernels'
builds disagree, no options line is written at all, so no kernel is given another kernel's mask; an initramfs
made while a different set of kernels was installed carries a file that says nothing its module does not.

A file of this name that rdna1-kmgr did not write is refused (install changes nothing), so the file's state
before the first install is always "absent" and the last rollback restores it by removing the file.
"""

from __future__ import annotations

from pathlib import Path

from rdna1_kmgr.core.errors import KmgrError
from rdna1_kmgr.core.files import write_atomic
from rdna1_kmgr.install.journal import Journal
from rdna1_kmgr.install.target_root import TargetRoot

NAME = "rdna1-kmgr.conf"
MARKER = "# Written by `rdna1-kmgr"  # the first line of every version of the file rdna1-kmgr wrote
ESCAPE_PARAMETER = "amdgpu.rdna1_quirks=0"


def path(root: TargetRoot) -> Path:
    return root.modprobe_dir / NAME


def is_ours(conf: Path) -> bool:
    try:
        with open(conf, errors="replace") as handle:
            return handle.readline().startswith(MARKER)
    except FileNotFoundError:
        return True  # absent: nothing of anyone else's to keep
    except OSError:
        return False


def installed_parameters(exclude: str | None = None) -> dict[str, dict[str, str]]:
    """Kernel -> module parameters of every finished install still in place, but `exclude`'s."""
    found = {}
    for kernel in Journal.kernels():
        if kernel == exclude:
            continue
        try:
            installed = Journal(kernel).state().in_place
        except KmgrError:
            continue  # a corrupted journal is refused by its own commands; it states nothing here
        if installed:
            # a boot-guarded install takes rdna1_quirks from GRUB's command line, not from this file
            found[kernel] = {} if installed.boot_guard else installed.parameters or {}
    return found


def text(kernels: dict[str, dict[str, str]], module: str = "amdgpu") -> str | None:
    """The file for these kernels' parameters (kernel -> {name: value}); None when no kernel is installed."""
    if not kernels:
        return None
    lines = [
        f"{MARKER} install` for the kernels it installed its {module} into (`rdna1-kmgr status` lists them).",
        "# Every install and rollback rewrites it for the kernels installed then; the last rollback removes it.",
        f"# For one boot without the RDNA1 quirks, put {ESCAPE_PARAMETER} on the kernel command line.",
        "# Kernels without the rdna1-kmgr module ignore these parameters (with a line in the kernel log).",
    ]
    distinct = {tuple(sorted(params.items())) for params in kernels.values()}
    if len(distinct) == 1:
        (shared,) = distinct
        if shared:
            lines.append(f"options {module} " + " ".join(f"{k}={v}" for k, v in shared))
    else:
        lines.append("# The installed builds carry different quirks, and each module's own default is the set it")
        lines.append("# was built with; an options line here would give some kernel another kernel's mask:")
        for kernel, params in sorted(kernels.items()):
            lines.append(f"#   {kernel}: " + (" ".join(f"{k}={v}" for k, v in sorted(params.items())) or "defaults"))
    return "\n".join(lines) + "\n"


def text_for(exclude: str | None = None, adding: tuple[str, dict[str, str]] | None = None) -> str | None:
    """The file for the kernels installed now, without `exclude`, with `adding` (kernel, parameters)."""
    kernels = installed_parameters(exclude)
    if adding is not None:
        kernels[adding[0]] = adding[1]
    return text(kernels)


def sync(conf: Path, exclude: str | None = None, adding: tuple[str, dict[str, str]] | None = None) -> str:
    """Write (or remove) the file for the kernels installed now; says what it did. Idempotent."""
    wanted = text_for(exclude, adding)
    if wanted is None:
        if conf.exists() or conf.is_symlink():
            conf.unlink()
            return f"removed {conf} (no kernel has an install any more)"
        return f"{conf} already absent"
    if conf.is_file() and conf.read_text(errors="replace") == wanted:
        return f"{conf} already right for the kernels still installed"
    write_atomic(conf, wanted.encode())
    return f"rewrote {conf} for the kernels still installed"


def undo_plan(conf: Path, kernel: str) -> str:
    """The line a rollback plan shows for this file."""
    others = sorted(installed_parameters(exclude=kernel))
    if others:
        return f"rewrite {conf} for the kernels still installed ({' '.join(others)})"
    return f"remove {conf} (if present)"
