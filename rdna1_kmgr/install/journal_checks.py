"""What a journal may say: replay acts only on records it can check against the code that writes them.

A journal is a root capability: rollback restores recorded paths from recorded backup names, runs recorded
commands and stops recorded programs. Folder permissions keep others out of it (0700, root's); this is the
check behind that, so that a record root's tool did not write is never acted on:

- a record's kind is one this tool writes (journal.py's list);
- an intent's step is one the journal's kind has (a kernel's install steps, the profile's, the parameter's,
  the experiment's boots), its files are the ones that step writes (the table below is computed from the
  modules that define the steps, for this run's target root and the journal's kernel), its folders lie above
  them, its backup names are the names Journal._backup gives (`<seq:03d>-<index>`: a plain name in the
  journal's own backups folder), its command and undo are the ones the step records, to the argument;
- the install's package is rdna1-kmgr's, its DKMS trees are this run's;
- a program record names a program a journaled run starts (journal_programs.py checks the live process).

The first record that fails is refused in one line naming it, before anything is stopped or undone: the
journal stays as it is, and the command exits non-zero.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.install import boot_guard, dkms_steps, initramfs, install_begin, modprobe_conf, stock_loader
from rdna1_kmgr.install.journal import Journal, JournalError
from rdna1_kmgr.install.profile_journal import (
    PARAMETER_DEFAULTS,
    PROFILE_ENVIRONMENT_D,
    PROFILE_PROFILE_D,
    NamedJournal,
    ParameterJournal,
    ProfileJournal,
)
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.install.undo import NotAnUndo, RewriteModprobeConf, Undo, Writer, regenerate
from rdna1_kmgr.install.undo import from_json as undo_from_json
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.render.quirk_mask import QuirkMask

# Every record kind journal.py, rollback.py, journal_programs.py and follow/kernel_removal.py append.
RECORD_KINDS = frozenset(
    {
        "begin",
        "intent",
        "done",
        "commit",
        "program",
        "rollback",
        "undone",
        "rollback-step",
        "rolled-back",
        "kernel-removed",
        "handed-over",
    }
)
ROLLBACK_STEPS = frozenset({"remove-package", "depmod"})  # rollback.py's rollback-step records
# The programs a journaled run starts (runner calls inside journal_programs.recorded: install's steps, their
# checks, and the rollback replaying them): dkms, the module tools, the initramfs tools (run in a target root
# with chroot or `env -C`), openssl checking the module's signature (modbuild/module_checks.py), GRUB's,
# systemd's daemon-reload.
PROGRAMS = frozenset(
    {"dkms", "depmod", "modinfo", "openssl", "chroot", "env", "lsinitramfs", "unmkinitramfs", "lsinitrd"}
    | {"update-grub", "grub-editenv", "grub-probe", "systemctl"}
    | set(initramfs.TOOLS)
)
BACKUP_NAME = re.compile(r"[0-9]{3,}-[0-9]+")  # Journal._backup's f"{seq:03d}-{index}"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|")
# module_build's versions: <kernel version>+p<patch-set hash>[+debug]; a plain name, never a path.
_PACKAGE_VERSION = re.compile(r"[0-9][0-9A-Za-z.~-]*\+p[0-9A-Za-z]+(\+debug)?")


class RecordRefused(JournalError):
    """A journal record replay cannot trust."""


@dataclass(frozen=True)
class StepRule:
    """What one step may record: the files it may replace, its command, its undo (None: none)."""

    files: Callable[[Path], bool]
    command: list[list[str] | None]
    undo: Undo | None = None


def check(journal: Journal, root: TargetRoot | None = None) -> None:
    """Refuse, in one line, the first record of `journal` that replay could not trust (RecordRefused)."""
    root = root if root is not None else TargetRoot.from_env()
    records = journal.records()
    begin = next((r for r in records if r["kind"] == "begin"), None)
    for record in records:
        problem = _problem(journal, root, begin, record)
        if problem:
            raise refused(journal, record, problem)


def refused(journal: Journal, record: dict, problem: str) -> RecordRefused:
    """The one line that refuses a record."""
    return RecordRefused(
        f"refusing the journal {journal.path}: record {record['seq']} ({record['kind']}) {problem}",
        "nothing was stopped or undone and the journal was kept; rdna1-kmgr did not write it as it stands: "
        "check it by hand",
    )


def _problem(journal: Journal, root: TargetRoot, begin: dict | None, record: dict) -> str | None:
    kind = record["kind"]
    if kind not in RECORD_KINDS:
        return "is of a kind rdna1-kmgr never writes"
    if kind == "begin":
        return _begin_problem(journal, root, record)
    if kind == "intent":
        rules = _rules(journal, root, begin)
        step = record.get("step")
        if not isinstance(step, str) or step not in rules:
            return f"names the step {step!r}, which is not one of this journal's"
        return _intent_problem(record, rules[step], root)
    if kind == "program":
        return program_problem(record)
    if kind == "rollback-step" and record.get("step") not in ROLLBACK_STEPS:
        return f"names the rollback step {record.get('step')!r}, which rollback never records"
    if kind == "undone" and not isinstance(record.get("of"), int):
        return "does not name the record it undid"
    if kind == "handed-over":
        return _handed_over_problem(journal, root, begin, record)
    return None


def _handed_over_problem(journal: Journal, root: TargetRoot, begin: dict | None, record: dict) -> str | None:
    """A backup handed over names an earlier intent of this journal and a file that intent backed up; the backup
    itself is checked as the step's own would be (its name is this record's)."""
    intent = next((r for r in journal.records() if r["kind"] == "intent" and r["seq"] == record.get("of")), None)
    if intent is None or intent["seq"] >= record["seq"]:
        return "does not name an earlier step of this journal"
    entry = record.get("entry")
    paths = [b.get("path") for b in intent["backups"] if isinstance(b, dict)]
    if not isinstance(entry, dict) or entry.get("path") not in paths:
        return f"hands over a backup of a file step {record.get('of')} never backed up"
    return _backup_problem(entry, f"{record['seq']:03d}-0", _rules(journal, root, begin)[intent["step"]])


def _begin_problem(journal: Journal, root: TargetRoot, begin: dict) -> str | None:
    if "root" in begin and begin["root"] != str(root.path):
        return f"was written for the root {begin['root']!r}, not this run's {str(root.path)!r}"
    if type(journal) is not Journal:
        return None
    if begin.get("kernel", journal.kernel) != journal.kernel:
        return f"names the kernel {begin.get('kernel')!r} in the journal of {journal.kernel}"
    if begin.get("package") is not None and begin["package"] != dkms.PACKAGE_NAME:
        return f"names the package {begin['package']!r}, not {dkms.PACKAGE_NAME}"
    version = begin.get("version")
    if version is not None and not (isinstance(version, str) and _PACKAGE_VERSION.fullmatch(version)):
        return f"names the version {version!r}, which is not one rdna1-kmgr builds"
    trees = dkms.Trees.from_env()
    if begin.get("trees") is not None and begin["trees"] != trees.to_json():
        return f"names the DKMS trees {begin['trees']!r}, not this run's {trees.to_json()!r}"
    return None


def _intent_problem(intent: dict, rule: StepRule, root: TargetRoot) -> str | None:
    if intent.get("command") not in rule.command:
        return f"records the command {intent.get('command')!r}, which its step does not run"
    try:
        recorded = undo_from_json(intent.get("undo"))
    except NotAnUndo as err:
        return f"records an undo rdna1-kmgr never writes ({err})"
    if recorded != rule.undo:
        return f"records the undo {intent.get('undo')!r}, which is not its step's"
    backups = intent.get("backups")
    if not isinstance(backups, list):
        return "has no list of backups"
    targets = []
    for index, entry in enumerate(backups):
        problem = _backup_problem(entry, f"{intent['seq']:03d}-{index}", rule)
        if problem:
            return problem
        targets.append(Path(entry["path"]))
    dirs = intent.get("dirs")
    if not isinstance(dirs, list):
        return "has no list of folders"
    for folder in dirs:
        if not (
            _plain_path(folder)
            and Path(folder).is_relative_to(root.path)
            and Path(folder) != root.path
            and any(target.is_relative_to(folder) and target != Path(folder) for target in targets)
        ):
            return f"would remove the folder {folder!r}, which is not above a file its step writes"
    return None


def _backup_problem(entry, name: str, rule: StepRule) -> str | None:
    if not isinstance(entry, dict) or not _plain_path(entry.get("path")):
        return f"names the target {entry!r}, which is not an absolute, plain path"
    path = entry["path"]
    if not rule.files(Path(path)):
        return f"would restore {path}, which its step never writes"
    if "symlink" in entry:
        return None if isinstance(entry["symlink"], str) and "\0" not in entry["symlink"] else f"bad link for {path}"
    backup = entry.get("backup")
    if backup is None:
        return None
    if not (isinstance(backup, str) and BACKUP_NAME.fullmatch(backup) and backup == name):
        return f"names the backup {backup!r} for {path}, where the journal writes {name!r} in its backups folder"
    if not (isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
        return f"has no sha256 for the backup of {path}"
    for key, top in (("mode", 0o7777), ("uid", 2**32 - 2), ("gid", 2**32 - 2)):
        value = entry.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top):
            return f"has no valid {key} for {path}"
    return None


def program_problem(record: dict) -> str | None:
    """Why a `program` record is not one journal_programs.recorded could have written (None: it could)."""
    argv = record.get("argv")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a for a in argv)):
        return "has no command line"
    if os.path.basename(argv[0]) not in PROGRAMS:
        return f"names the program {argv[0]!r}, which a journaled run never starts"
    session, start = record.get("session"), record.get("start_time")
    if not (isinstance(session, int) and not isinstance(session, bool) and session > 1):
        return f"names the session {session!r}, which is no program's"
    if not (isinstance(start, int) and not isinstance(start, bool) and start >= 0):
        return f"has no start time for session {session}"
    if not (isinstance(record.get("boot_id"), str) and _BOOT_ID.fullmatch(record["boot_id"])):
        return f"has no boot id for session {session}"
    return None


def _plain_path(value) -> bool:
    """An absolute path with nothing to resolve: no `.`, `..`, doubled or trailing slash, no NUL."""
    return isinstance(value, str) and value.startswith("/") and "\0" not in value and os.path.normpath(value) == value


def _exactly(paths) -> Callable[[Path], bool]:
    allowed = frozenset(paths)
    return lambda path: path in allowed


def _below(folder: Path, pattern: str = "*") -> Callable[[Path], bool]:
    return lambda path: path.is_relative_to(folder) and path != folder and path.match(pattern)


# --- the table: kind of journal, step -> what the step may record --------------------------------------------


# The rules of journals a later stage writes (the experiment's boots, experiment/boot_cells.py), by journal
# name, registered by the module that writes them. A journal with no rules known has no step replay trusts.
_LATER_STAGES: dict[str, Callable[[TargetRoot], dict[str, StepRule]]] = {}


def register(name: str, rules: Callable[[TargetRoot], dict[str, StepRule]]) -> None:
    _LATER_STAGES[name] = rules


def _rules(journal: Journal, root: TargetRoot, begin: dict | None) -> dict[str, StepRule]:
    if isinstance(journal, ProfileJournal):
        paths = [root.path / rel for rel in (PROFILE_ENVIRONMENT_D, PROFILE_PROFILE_D)]
        return {f"write {path}": StepRule(_exactly([path]), [None]) for path in paths}
    if isinstance(journal, ParameterJournal):
        path = root.path / PARAMETER_DEFAULTS
        return {f"write {path}": StepRule(_exactly([path]), [None], regenerate(Writer.FILES, [["update-grub"]]))}
    if isinstance(journal, NamedJournal):
        later = _LATER_STAGES.get(journal.NAME)
        return later(root) if later else {}
    kernel = journal.kernel
    tools = [tool(root) for tool in initramfs.TOOLS.values()]
    modules = root.modules_dir(kernel)
    conf = modprobe_conf.path(root)
    settings = boot_guard.Settings(QuirkMask(0))  # the guard's file names do not depend on its settings
    guard_files = [*boot_guard.files(root, settings), *boot_guard.links(root), *boot_guard.runtime_files(root)]
    rules = {
        "depmod": StepRule(_below(modules, "modules.*"), [None, root.depmod_command(kernel)]),
        "modprobe-conf": StepRule(_exactly([conf]), [None], RewriteModprobeConf(conf, kernel)),
        "stock-loader": StepRule(_exactly(p for tool in tools for p in stock_loader.files(root, tool)), [None]),
        "initramfs": StepRule(
            _exactly(p for tool in tools for p in tool.outputs(kernel)),
            [None, *(tool.regenerate_command(kernel) for tool in tools)],
        ),
        "boot-guard": StepRule(
            _exactly(guard_files), [None], regenerate(Writer.BOOT_GUARD, boot_guard.undo_commands(root))
        ),
    }
    installed = install_begin.read(begin)
    if installed and installed.package:
        package = installed.package
        trees = dkms.Trees.from_env()
        rules["dkms-install"] = StepRule(
            _below(modules),
            [dkms_steps.install_command(package, kernel, trees, root)],
            dkms_steps.uninstall_undo(package, kernel, trees, root),
        )
    return rules
