"""What a journal may say: replay acts only on records it can check against the code that writes them.

A journal is a root capability: rollback restores recorded paths from recorded backup names, runs recorded
commands and stops recorded programs. Folder permissions keep others out of it (0700, root's); this is the
check behind that, so that a record root's tool did not write is never acted on:

- a record is one this tool writes, field for field (journal_records.py: refused as the journal is read);
- the journal begins with what its stage begins (a kernel's with an install, the profile's with a profile...);
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.install import boot_guard, dkms_steps, initramfs, modprobe_conf, stock_loader
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal import Journal, RecordRefused
from rdna1_kmgr.install.journal import refused as refused_line
from rdna1_kmgr.install.journal_records import (
    Backup,
    Begin,
    Begun,
    Entry,
    ExperimentBegin,
    HandedOver,
    Intent,
    ParameterBegin,
    ProfileBegin,
    Program,
    RollbackStep,
    WasFile,
)
from rdna1_kmgr.install.profile_journal import (
    PARAMETER_DEFAULTS,
    PROFILE_ENVIRONMENT_D,
    PROFILE_PROFILE_D,
    ExperimentJournal,
    NamedJournal,
    ParameterJournal,
    ProfileJournal,
)
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.install.undo import NotAnUndo, RewriteModprobeConf, Undo, Writer, regenerate
from rdna1_kmgr.install.undo import from_json as undo_from_json
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.render.quirk_mask import QuirkMask

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
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|")
# module_build's versions: <kernel version>+p<patch-set hash>[+debug]; a plain name, never a path.
_PACKAGE_VERSION = re.compile(r"[0-9][0-9A-Za-z.~-]*\+p[0-9A-Za-z]+(\+debug)?")
# What begins each kind of journal (a kernel's: install, module_install.py), by the stage that writes it.
_BEGUN_BY: dict[type[Journal], type[Begun]] = {
    Journal: InstallBegin,
    ProfileJournal: ProfileBegin,  # install/user_profile.py
    ParameterJournal: ParameterBegin,  # install/kernel_parameters.py
    ExperimentJournal: ExperimentBegin,  # experiment/kernel_run.py
}


@dataclass(frozen=True)
class StepRule:
    """What one step may record: the files it may replace, its command, its undo (None: none)."""

    files: Callable[[Path], bool]
    command: list[list[str] | None]
    undo: Undo | None = None


def check(journal: Journal, root: TargetRoot | None = None) -> None:
    """Refuse, in one line, the first record of `journal` that replay could not trust (RecordRefused): one no
    release writes when the journal is read, then one its stage did not write."""
    root = root if root is not None else TargetRoot.from_env()
    entries = journal.records()
    begin = next((e.record for e in entries if isinstance(e.record, Begin)), None)
    for entry in entries:
        problem = _problem(journal, root, begin, entry, entries)
        if problem:
            raise refused(journal, entry, problem)


def refused(journal: Journal, entry: Entry, problem: str) -> RecordRefused:
    """The one line that refuses a record."""
    return refused_line(journal.path, entry.seq, entry.kind, problem)


def _problem(journal: Journal, root: TargetRoot, begin: Begin | None, entry: Entry, entries: list[Entry]) -> str | None:
    record = entry.record
    if isinstance(record, Begin):
        return _begin_problem(journal, root, record)
    if isinstance(record, Intent):
        rules = _rules(journal, root, begin)
        if record.step not in rules:
            return f"names the step {record.step!r}, which is not one of this journal's"
        return _intent_problem(entry.seq, record, rules[record.step], root)
    if isinstance(record, Program):
        return program_problem(record)
    if isinstance(record, RollbackStep) and record.step not in ROLLBACK_STEPS:
        return f"names the rollback step {record.step!r}, which rollback never records"
    if isinstance(record, HandedOver):
        return _handed_over_problem(journal, root, begin, entry.seq, record, entries)
    return None


def _handed_over_problem(
    journal: Journal, root: TargetRoot, begin: Begin | None, seq: int, record: HandedOver, entries: list[Entry]
) -> str | None:
    """A backup handed over names an earlier intent of this journal and a file that intent backed up; the backup
    itself is checked as the step's own would be (its name is this record's)."""
    intent = next((e.record for e in entries if e.seq == record.of and e.seq < seq), None)
    if not isinstance(intent, Intent):
        return "does not name an earlier step of this journal"
    if record.entry.path not in [backup.path for backup in intent.backups]:
        return f"hands over a backup of a file step {record.of} never backed up"
    return _backup_problem(record.entry, f"{seq:03d}-0", _rules(journal, root, begin)[intent.step])


def _begin_problem(journal: Journal, root: TargetRoot, begin: Begin) -> str | None:
    expected = _BEGUN_BY.get(type(journal))
    if expected is not None and not isinstance(begin.begun, expected):
        return f"begins {begin.operation!r} in a journal that only {expected.OPERATION!r} begins"
    if isinstance(begin.begun, InstallBegin | ProfileBegin) and begin.begun.root != str(root.path):
        return f"was written for the root {begin.begun.root!r}, not this run's {str(root.path)!r}"
    if not isinstance(begin.begun, InstallBegin):
        return None
    installed = begin.begun
    if installed.kernel != journal.kernel:
        return f"names the kernel {installed.kernel!r} in the journal of {journal.kernel}"
    if installed.package is not None and installed.package.name != dkms.PACKAGE_NAME:
        return f"names the package {installed.package.name!r}, not {dkms.PACKAGE_NAME}"
    if installed.package is not None and not _PACKAGE_VERSION.fullmatch(installed.package.version):
        return f"names the version {installed.package.version!r}, which is not one rdna1-kmgr builds"
    trees = dkms.Trees.from_env()
    if installed.trees is not None and installed.trees != trees:
        return f"names the DKMS trees {installed.trees.to_json()!r}, not this run's {trees.to_json()!r}"
    return None


def _intent_problem(seq: int, intent: Intent, rule: StepRule, root: TargetRoot) -> str | None:
    command = list(intent.command) if intent.command is not None else None
    if command not in rule.command:
        return f"records the command {command!r}, which its step does not run"
    try:
        recorded = undo_from_json(intent.undo)
    except NotAnUndo as err:
        return f"records an undo rdna1-kmgr never writes ({err})"
    if recorded != rule.undo:
        return f"records the undo {intent.undo!r}, which is not its step's"
    for index, entry in enumerate(intent.backups):
        problem = _backup_problem(entry, f"{seq:03d}-{index}", rule)
        if problem:
            return problem
    targets = [Path(entry.path) for entry in intent.backups]
    for folder in intent.dirs:
        if not (
            _plain_path(folder)
            and Path(folder).is_relative_to(root.path)
            and Path(folder) != root.path
            and any(target.is_relative_to(folder) and target != Path(folder) for target in targets)
        ):
            return f"would remove the folder {folder!r}, which is not above a file its step writes"
    return None


def _backup_problem(entry: Backup, name: str, rule: StepRule) -> str | None:
    """The target a plain path its step writes; a copy named as the journal names it (its sha256, mode and owner
    were read as journal_records reads them)."""
    if not _plain_path(entry.path):
        return f"names the target {entry.to_json()!r}, which is not an absolute, plain path"
    if not rule.files(Path(entry.path)):
        return f"would restore {entry.path}, which its step never writes"
    if isinstance(entry, WasFile) and not (BACKUP_NAME.fullmatch(entry.backup) and entry.backup == name):
        return (
            f"names the backup {entry.backup!r} for {entry.path}, where the journal writes {name!r} in its "
            "backups folder"
        )
    return None


def program_problem(record: Program) -> str | None:
    """Why a `program` record is not one journal_programs.recorded could have written (None: it could)."""
    if os.path.basename(record.argv[0]) not in PROGRAMS:
        return f"names the program {record.argv[0]!r}, which a journaled run never starts"
    if record.session <= 1:
        return f"names the session {record.session!r}, which is no program's"
    if record.start_time < 0:
        return f"has no start time for session {record.session}"
    if not _BOOT_ID.fullmatch(record.boot_id):
        return f"has no boot id for session {record.session}"
    return None


def _plain_path(value: str) -> bool:
    """An absolute path with nothing to resolve: no `.`, `..`, doubled or trailing slash, no NUL."""
    return value.startswith("/") and "\0" not in value and os.path.normpath(value) == value


def _exactly(paths: Iterable[Path]) -> Callable[[Path], bool]:
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


def _rules(journal: Journal, root: TargetRoot, begin: Begin | None) -> dict[str, StepRule]:
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
    installed = begin.begun if begin is not None and isinstance(begin.begun, InstallBegin) else None
    if installed and installed.package:
        package = installed.package
        trees = dkms.Trees.from_env()
        rules["dkms-install"] = StepRule(
            _below(modules),
            [dkms_steps.install_command(package, kernel, trees, root)],
            dkms_steps.uninstall_undo(package, kernel, trees, root),
        )
    return rules
