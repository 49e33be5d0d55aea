"""What undoing a journaled step does beside putting its files back: a small tagged union, spelled in this file only.

An intent record carries its step's undo as JSON (each kind's `to_json`, the one writer); rollback reads it back
with `from_json`, which takes only what `to_json` writes, and journal_checks compares it with the undo the step's own
code makes. Each kind says its part of a rollback's plan and does it:

    dkms-uninstall     `dkms uninstall` first, when DKMS still lists the module installed
    modprobe-conf      the shared modprobe.d file rewritten for the kernels left (never restored from a backup:
                       a later install of another kernel wrote it since; modprobe_conf.py says why)
    boot-guard, files, experiment-boots
                       programs that regenerate from the restored files (update-grub, grub-editenv), run after
                       the files are back: the three differ in who wrote them, not in what undoing does
"""

from __future__ import annotations

import enum
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdna1_kmgr.core import runner
from rdna1_kmgr.install import grub_commands, modprobe_conf
from rdna1_kmgr.modbuild import dkms_package as dkms

Command = tuple[str, ...]


@dataclass(frozen=True)
class DkmsUninstall:
    """The dkms-install step's undo: `command` uninstalls `package`/`version` from `kernel` in `trees`."""

    package: str
    version: str
    kernel: str
    command: Command
    trees: dkms.Trees
    restores_files = True

    def plan_before(self) -> list[str]:
        return [f"{' '.join(self.command)}   (if DKMS lists it installed)"]

    def before(self) -> list[str]:
        if not shutil.which("dkms"):
            return ["dkms is not installed any more: the module file is removed below, DKMS's own record stays"]
        installed = any(
            e.version == self.version and e.kernel == self.kernel and e.state == "installed"
            for e in dkms.status(self.package, self.trees)
        )
        if not installed:
            return [f"{self.package}/{self.version} is not installed in DKMS for {self.kernel}"]
        run(self.command, "dkms uninstall")
        return [" ".join(self.command)]

    def plan_after(self) -> list[str]:
        return []

    def after(self) -> list[str]:
        return []

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "dkms-uninstall",
            "package": self.package,
            "version": self.version,
            "kernel": self.kernel,
            "command": list(self.command),
            "trees": self.trees.to_json(),
        }


@dataclass(frozen=True)
class RewriteModprobeConf:
    """The modprobe-conf step's undo: the file serves every kernel with an install, so it is rewritten for the
    ones left instead of restored."""

    path: Path
    kernel: str
    restores_files = False

    def plan_before(self) -> list[str]:
        return [modprobe_conf.undo_plan(self.path, self.kernel)]

    def before(self) -> list[str]:
        return [modprobe_conf.sync(self.path, exclude=self.kernel)]

    def plan_after(self) -> list[str]:
        return []

    def after(self) -> list[str]:
        return []

    def to_json(self) -> dict[str, Any]:
        return {"kind": "modprobe-conf", "path": str(self.path), "kernel": self.kernel}


class Writer(enum.Enum):
    """Who wrote the files whose undo regenerates from them."""

    BOOT_GUARD = "boot-guard"  # install's boot-guard step
    FILES = "files"  # profile_journal.write_files with commands to run after (the kernel parameter's GRUB)
    EXPERIMENT_BOOTS = "experiment-boots"  # the experiment's kernel-cell boots


@dataclass(frozen=True)
class Regenerate:
    """Once the files are back, `commands` regenerate what was made from them (GRUB's: grub_commands runs them)."""

    writer: Writer
    commands: tuple[Command, ...]
    restores_files = True

    def plan_before(self) -> list[str]:
        return []

    def before(self) -> list[str]:
        return []

    def plan_after(self) -> list[str]:
        return [" ".join(command) for command in self.commands]

    def after(self) -> list[str]:
        grub_commands.run(self.commands, lambda command: run(tuple(command), command[0]))
        return [" ".join(command) for command in self.commands]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.writer.value, "after": [list(command) for command in self.commands]}


Undo = DkmsUninstall | RewriteModprobeConf | Regenerate


def regenerate(writer: Writer, commands: list[list[str]]) -> Regenerate:
    return Regenerate(writer, tuple(tuple(command) for command in commands))


def dkms_uninstall(package: dkms.Package, kernel: str, command: list[str], trees: dkms.Trees) -> DkmsUninstall:
    return DkmsUninstall(package.name, package.version, kernel, tuple(command), trees)


def run(command: Command, what: str) -> None:
    runner.run(list(command), timeout=900, doing=f"{what} during rollback", hint="fix the cause and run rollback again")


# --- JSON: each kind's `to_json` writes it (journal.record_intent), this reads it -------------------------------


class NotAnUndo(ValueError):
    """A record's `undo` field that no `to_json` could have written."""


def from_json(value: object) -> Undo | None:
    """The undo an intent record carries; NotAnUndo for anything `to_json` does not write, to the key."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise NotAnUndo(f"not an object: {value!r}")
    kind = value.get("kind")
    try:
        if kind == "dkms-uninstall":
            _keys(value, {"kind", "package", "version", "kernel", "command", "trees"})
            trees = value["trees"]
            _keys(trees, {"source", "dkms"})
            undo: Undo = DkmsUninstall(
                _text(value["package"]),
                _text(value["version"]),
                _text(value["kernel"]),
                _command(value["command"]),
                dkms.Trees(source=Path(_text(trees["source"])), dkms=Path(_text(trees["dkms"]))),
            )
        elif kind == "modprobe-conf":
            _keys(value, {"kind", "path", "kernel"})
            undo = RewriteModprobeConf(Path(_text(value["path"])), _text(value["kernel"]))
        else:
            _keys(value, {"kind", "after"})
            after = value["after"]
            if not isinstance(after, list):
                raise NotAnUndo(f"commands that are not a list: {after!r}")
            undo = Regenerate(Writer(kind), tuple(_command(command) for command in after))
    except (TypeError, ValueError) as err:  # Writer(kind) on an unknown kind; a wrong type anywhere
        raise NotAnUndo(f"{value!r}: {err}") from None
    if undo.to_json() != value:  # what survives the round trip is exactly what was written
        raise NotAnUndo(f"{value!r} is not written that way")
    return undo


def _keys(value: object, keys: set[str]) -> None:
    if not isinstance(value, dict) or set(value) != keys:
        raise NotAnUndo(f"fields {sorted(value) if isinstance(value, dict) else value!r}, not {sorted(keys)}")


def _text(value: object) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise NotAnUndo(f"not a string: {value!r}")
    return value


def _command(value: object) -> Command:
    if not isinstance(value, list) or not value:
        raise NotAnUndo(f"not a command: {value!r}")
    return tuple(_text(argument) for argument in value)
