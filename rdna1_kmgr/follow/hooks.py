"""The hooks that call `rdna1-kmgr follow`, placed where the distribution runs them (install.sh calls this).

Debian and Ubuntu, the places DKMS uses too:

    /etc/kernel/postinst.d/rdna1-kmgr          a kernel image was installed: note it as pending (inside dpkg)
    /etc/kernel/header_postinst.d/rdna1-kmgr   its headers were: the same (they may come after the image)
    /etc/kernel/postrm.d/rdna1-kmgr            a kernel was removed: drop its build, journal and records
    /etc/apt/apt.conf.d/80rdna1-kmgr           DPkg::Post-Invoke: once dpkg is done, do the pending work
    /etc/systemd/system/rdna1-kmgr-follow.service (+ multi-user.target.wants link): the same at boot, for
                                               work the owner rebooted before (or that was interrupted)

Fedora would call the same command from /etc/kernel/postinst.d (kernel-install runs it, as akmods does) or a
/usr/lib/kernel/install.d/ plugin; Arch from a pacman hook (/etc/pacman.d/hooks/*.hook, `When = PostTransaction`
on `usr/lib/modules/*/vmlinuz`). Neither is placed here yet: their records (host/platforms.toml `kernel_hooks`)
name hooks KERNEL_HOOKS does not have, and `hooks install` says so.

Each file is a template in hooks/ with @CLI@ standing for the absolute path of this installation's command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

from rdna1_kmgr.core import trust
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.files import make_dirs, write_atomic
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.install.target_root import TargetRoot

UNIT = "rdna1-kmgr-follow.service"


@dataclass(frozen=True)
class HookFile:
    where: str  # relative to the root
    template: str | None  # a file in hooks/; None for the unit's enabling link
    mode: int = 0o644
    link_to: str | None = None


HOOKS = (
    HookFile("etc/kernel/postinst.d/rdna1-kmgr", "kernel-hook.sh", 0o755),
    HookFile("etc/kernel/header_postinst.d/rdna1-kmgr", "kernel-hook.sh", 0o755),
    HookFile("etc/kernel/postrm.d/rdna1-kmgr", "kernel-hook.sh", 0o755),
    HookFile("etc/apt/apt.conf.d/80rdna1-kmgr", "apt-post-invoke.conf"),
    HookFile(f"etc/systemd/system/{UNIT}", UNIT),
    HookFile(f"etc/systemd/system/multi-user.target.wants/{UNIT}", None, link_to=f"../{UNIT}"),
)


class KernelHooks(Protocol):
    """Where a distribution's package manager runs a command when a kernel is installed or removed: the files that
    make it run `rdna1-kmgr follow`."""

    @property
    def files(self) -> tuple[HookFile, ...]: ...


@dataclass(frozen=True)
class HookSet:
    files: tuple[HookFile, ...]


# By the name in the platform record (host/platforms.toml `kernel_hooks`).
KERNEL_HOOKS: dict[str, KernelHooks] = {"debian-kernel-hooks": HookSet(HOOKS)}


def hooks_for(root: TargetRoot) -> tuple[HookFile, ...]:
    """The hook files of `root`'s distribution, as its platform record names them (HostError: it names none
    rdna1-kmgr places)."""
    record = system_identity.read(root.path).platform
    hooks = KERNEL_HOOKS.get(record.kernel_hooks or "")
    if hooks is None:
        raise HostError(
            f"rdna1-kmgr places no kernel hooks on {record.name} ({record.kernel_hooks or 'none known'})",
            "after installing a kernel, run `rdna1-kmgr follow --kernel KREL` for it yourself",
        )
    return hooks.files


def every_hook() -> tuple[HookFile, ...]:
    """Every file any distribution's hooks place (what `hooks remove` looks for, whichever placed them)."""
    return tuple(dict.fromkeys(hook for hooks in KERNEL_HOOKS.values() for hook in hooks.files))


this_command = trust.this_command  # the rdna1-kmgr of this installation, checked: the hooks call it by path


def content(hook: HookFile, cli: Path) -> bytes:
    assert hook.template is not None, "a link has no content: callers handle link_to first"
    text = resources.files("rdna1_kmgr.hooks").joinpath(hook.template).read_text()
    return text.replace("@CLI@", str(cli)).encode()


def _current(path: Path, hook: HookFile, cli: Path) -> bool:
    if hook.link_to is not None:
        return path.is_symlink() and os.readlink(path) == hook.link_to
    try:
        return path.read_bytes() == content(hook, cli) and (path.stat().st_mode & 0o7777) == hook.mode
    except OSError:
        return False


def plan(root: TargetRoot, cli: Path, hooks: tuple[HookFile, ...], removing: bool = False) -> list[str]:
    lines = []
    for hook in hooks:
        path = root.path / hook.where
        present = path.exists() or path.is_symlink()
        if removing:
            if present:
                lines.append(f"remove {path}")
        elif not _current(path, hook, cli):
            what = f"link {path} -> {hook.link_to}" if hook.link_to else f"write {path} (mode {hook.mode:o})"
            lines.append(("replace: " if present else "") + what)
    return lines


def install(root: TargetRoot, cli: Path, dry_run: bool = False) -> list[str]:
    """Place every hook calling `cli`; what it did (or would do). Idempotent. Refused (one line) when `cli`, or
    what it runs, could be changed by anyone but root: the hooks run it as root."""
    if not cli.is_file():
        raise HostError(f"{cli} does not exist", "install rdna1-kmgr first (install.sh), then place the hooks")
    trust.trusted_command(cli)
    hooks = hooks_for(root)
    lines = plan(root, cli, hooks)
    if dry_run:
        return lines
    for hook in hooks:
        path = root.path / hook.where
        if _current(path, hook, cli):
            continue
        try:
            make_dirs(path.parent)
            if hook.link_to is not None:
                path.unlink(missing_ok=True)
                path.symlink_to(hook.link_to)
            else:
                write_atomic(path, content(hook, cli), hook.mode)
        except OSError as err:
            raise HostError(f"cannot write {path}: {err.strerror or err}", "run as root") from None
    return lines


def remove(root: TargetRoot, dry_run: bool = False) -> list[str]:
    hooks = every_hook()
    lines = plan(root, Path("/nonexistent"), hooks, removing=True)  # removing: which command they call is no matter
    if dry_run:
        return lines
    for hook in hooks:
        path = root.path / hook.where
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            raise HostError(f"cannot remove {path}: {err.strerror or err}", "run as root") from None
    return lines


def installed(root: TargetRoot) -> dict[str, bool]:
    return {
        str(root.path / h.where): (root.path / h.where).exists() or (root.path / h.where).is_symlink()
        for h in every_hook()
    }
