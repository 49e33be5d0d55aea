"""`rdna1-kmgr rollback`: replay a kernel's journal backwards, exactly, as often as it takes.

A rollback is one list of stages (`stages`): its plan (the dry run, and install's "first undo the install now
in place") is each stage's `plan`, its replay each stage's `run`.

    UndoStep       for each step of the install, newest first, not undone yet: its undo's first part (`dkms
                   uninstall` when DKMS still lists the module installed; install/undo.py has the kinds), every
                   backed-up file put back byte for byte (or removed when it was absent before), the directories
                   the step created removed, then what regenerates from the restored files (the boot guard's
                   `update-grub`); recorded `undone`
    RemovePackage  the install's DKMS package removed for that kernel (its source too when no other kernel uses
                   it); KeepPackage with --keep-build
    FinalDepmod    when the module index was touched (and existed before), depmod once more: the result equals
                   the restored index, unless other modules were added meanwhile, which a plain restore would hide

Then `rolled-back` is recorded and the journal moves to history/. Every action looks at the current state
first, so a rollback killed anywhere, or an install killed anywhere (even inside a step), is finished by running
rollback again.
"""

from __future__ import annotations

import datetime
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rdna1_kmgr.core import files, progress, user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.output import optional
from rdna1_kmgr.install import journal_checks, journal_programs
from rdna1_kmgr.install.journal import (
    Journal,
    JournalError,
    abort_point,
    deepest_first,
    journal_root,
    locked,
    refuse_if_busy,
    remove_created_dirs,
)
from rdna1_kmgr.install.journal_records import (
    Backup,
    ParameterBegin,
    ProfileBegin,
    Rollback,
    RollbackStep,
    RolledBack,
    Undone,
    WasAbsent,
    WasFile,
    WasLink,
)
from rdna1_kmgr.install.journal_state import State, StepState
from rdna1_kmgr.install.profile_journal import ExperimentJournal, ParameterJournal, ProfileJournal
from rdna1_kmgr.install.undo import NotAnUndo, Undo
from rdna1_kmgr.install.undo import from_json as undo_from_json
from rdna1_kmgr.install.undo import run as run_during_rollback
from rdna1_kmgr.modbuild import dkms_package as dkms


def undo_of(step: StepState) -> Undo | None:
    """The step's undo beyond its files. journal_checks refuses a journal whose undo does not parse before its
    replay; another kernel's journal read for its files (a later install's) is refused here, in one line."""
    try:
        return undo_from_json(step.intent.undo)
    except NotAnUndo as err:
        raise JournalError(
            f"record {step.seq} ({step.step}) of a journal records an undo rdna1-kmgr never writes ({err})",
            f"nothing was changed; check the journals under {journal_root()} by hand",
        ) from None


# kmod's depmod writes each index as NAME.PID.USEC.SEC beside it, then renames it into place: a power cut
# between the two leaves that file (tests/install/test_install_power_cut.py found an empty
# modules.alias.bin.671.4857.1795930668 after a cut during depmod)
_DEPMOD_TEMPORARY = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


def remove_leftovers(path: Path) -> list[Path]:
    """The temporary files beside `path` that a write cut short left, removed: the tool's own (a power cut between
    the temporary file's fsync and its rename; core/files.write_atomic) and, beside a module index, depmod's.
    Nothing else names them."""
    found = files.leftover_temporaries(path)
    if path.name.startswith("modules."):
        found += files.regular_files_named(path.parent, f"{path.name}.", _DEPMOD_TEMPORARY)
    for tmp in found:
        tmp.unlink()
    return found


def restored(step: StepState) -> list[Backup]:
    """The backups a step's undo puts back, newest first (none when its undo rewrites the file instead)."""
    undo = undo_of(step)
    return list(reversed(step.intent.backups)) if undo is None or undo.restores_files else []


class RollbackStage(Protocol):
    """One part of a rollback: the lines its plan shows, and doing it (recorded in the journal)."""

    def plan(self) -> list[str]: ...

    def run(self, journal: Journal) -> list[str]: ...


@dataclass(frozen=True)
class UndoStep:
    """One journaled step undone: its undo's first part (`dkms uninstall`), its files put back, the folders it
    created removed, then what regenerates from the files (update-grub); recorded `undone`."""

    step: StepState

    def plan(self) -> list[str]:
        undo = undo_of(self.step)
        lines = [f"undo {self.step.step}" + ("" if self.step.done else " (it was interrupted)") + ":"]
        lines += undo.plan_before() if undo else []
        for entry in restored(self.step):
            if isinstance(entry, WasAbsent):
                lines.append(f"remove {entry.path} (if present)")
            else:
                lines.append(f"restore {entry.path} from the journal's backup")
        if self.step.intent.backups:
            lines.append(
                "remove the temporary files rdna1-kmgr or depmod left beside them (if a write cut short left any)"
            )
        lines += [f"remove the directory {folder} (if empty)" for folder in deepest_first(self.step.intent.dirs)]
        lines += undo.plan_after() if undo else []
        return [lines[0], *(f"    {line}" for line in lines[1:])]

    def run(self, journal: Journal) -> list[str]:
        undo = undo_of(self.step)
        said = undo.before() if undo else []
        said += [journal.restore(entry) for entry in restored(self.step)]
        for entry in self.step.intent.backups:  # every file the step writes, whoever undoes it
            said += [f"removed {tmp}, left by a write cut short" for tmp in remove_leftovers(Path(entry.path))]
        said += [f"removed the directory {folder}" for folder in remove_created_dirs(self.step.intent.dirs)]
        said += undo.after() if undo else []
        journal.append(Undone(self.step.step, self.step.seq))
        abort_point(f"undo-{self.step.step}")
        return [f"undo {self.step.step}: {line}" for line in said]


@dataclass(frozen=True)
class RemovePackage:
    """The install's DKMS package removed for its kernel (its source too when no other kernel uses it)."""

    package: dkms.Package
    trees: dkms.Trees
    kernel: str

    def plan(self) -> list[str]:
        return [
            f"{' '.join(dkms.command(dkms.remove_args(self.package, self.kernel), self.trees))}   (if DKMS lists it)",
            f"  remove {self.package.source_dir(self.trees)} when no other kernel uses {self.package.ref}",
        ]

    def run(self, journal: Journal) -> list[str]:
        said = []
        if shutil.which("dkms"):
            dkms.remove(self.package, self.trees, self.kernel)
            said.append(f"removed the DKMS package {self.package.ref} for {self.kernel}")
        journal.append(RollbackStep("remove-package"))
        abort_point("remove-package")
        return said


@dataclass(frozen=True)
class KeepPackage:
    """--keep-build: the install's DKMS package stays."""

    package: dkms.Package

    def plan(self) -> list[str]:
        return [f"keep the build {self.package.ref} (--keep-build)"]

    def run(self, journal: Journal) -> list[str]:
        return []


@dataclass(frozen=True)
class FinalDepmod:
    """depmod once more: the result equals the restored index, unless other modules were added meanwhile, which a
    plain restore would hide."""

    command: list[str]

    def plan(self) -> list[str]:
        return [" ".join(self.command)]

    def run(self, journal: Journal) -> list[str]:
        run_during_rollback(tuple(self.command), "depmod")
        journal.append(RollbackStep("depmod"))
        abort_point("final-depmod")
        return [f"regenerated the module index: {' '.join(self.command)}"]


def stages(state: State, keep_build: bool) -> list[RollbackStage]:
    """The rollback of a journal's state, in order: the one list its plan shows and its replay runs."""
    listed: list[RollbackStage] = [UndoStep(step) for step in reversed(state.steps) if not step.undone]
    package = _package_of(state)
    if package:
        listed.append(KeepPackage(package[0]) if keep_build else RemovePackage(*package))
    depmod = _final_depmod(state)
    if depmod:
        listed.append(FinalDepmod(depmod))
    return listed


def _package_of(state: State) -> tuple[dkms.Package, dkms.Trees, str] | None:
    installed = state.install
    if installed is None or installed.package is None:
        return None
    return installed.package, installed.dkms_trees, installed.kernel


def _final_depmod(state: State) -> list[str] | None:
    """The depmod of the install, when the module index may have been touched and there was one before: a
    kernel whose image is not installed had no index (modules.dep absent), and restoring leaves none."""
    for step in state.steps:
        if step.step == "depmod" and step.intent.command:
            had_index = any(
                Path(b.path).name == "modules.dep" and isinstance(b, WasFile | WasLink) for b in step.intent.backups
            )
            return list(step.intent.command) if had_index else None
    return None


def plan_for(journal: Journal, keep_build: bool) -> list[str]:
    """The exact rollback of one kernel's journal, in order (changes nothing); a record replay could not trust
    is refused here (journal_checks)."""
    journal_checks.check(journal)
    state = journal.state()
    begun = state.begin.begun if state.begin else None
    said = f"{state.description} (journal {journal.path})"
    if isinstance(journal, ProfileJournal):
        lines = [f"user-space profile {begun.profile if isinstance(begun, ProfileBegin) else '?'}: {said}"]
    elif isinstance(journal, ExperimentJournal):
        lines = [f"the experiment's kernel-cell boots: {said}"]
    elif isinstance(journal, ParameterJournal):
        lines = [f"kernel parameter {begun.parameter if isinstance(begun, ParameterBegin) else '?'}: {said}"]
    else:
        package = state.install.package if state.install else None
        lines = [f"kernel {journal.kernel}: {package.ref if package else '?/?'}, {said}"]
    lines += [f"  {line}" for stage in stages(state, keep_build) for line in stage.plan()]
    lines.append(f"  move the journal to the history; drop its backups in {journal.backups}/")
    return lines


def replay(journal: Journal, keep_build: bool, reason: str) -> list[str]:
    """Undo everything the journal records (the caller holds the lock); what was done, line by line. Every
    record is checked first: one replay could not trust refuses the whole journal, nothing stopped or undone."""
    journal_checks.check(journal)
    # First the programs a killed run left running: update-initramfs would otherwise write over the restore.
    said = journal_programs.stop_left_over(journal)
    state = journal.state()
    if state.rolled_back:
        journal.archive()
        return [*said, "the journal was already rolled back; moved it to the history"]
    with journal_programs.recorded(journal):
        journal.append(Rollback(reason, keep_build))
        for stage in stages(state, keep_build):
            said += stage.run(journal)
        journal.append(RolledBack())
    history = journal.archive()
    said.append(f"rolled back {journal.kernel}; journal kept as {history}")
    return said


# --- the command -------------------------------------------------------------------------------------------


def _started(journal: Journal) -> tuple[datetime.datetime, str]:
    """When the journal's install began, to undo the newest first: a later install (follow's, for a new kernel)
    backs up the files an earlier one wrote (the boot guard's), so undoing it first puts those back as the
    earlier install left them, and the earlier one's undo then returns them to before both. Oldest when
    unreadable (plan_for refuses it with the reason)."""
    try:
        started = datetime.datetime.strptime(journal.records()[0].time, "%Y-%m-%dT%H:%M:%S%z")
    except (JournalError, IndexError, ValueError):
        started = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    return started, journal.kernel


def _written_files(journal: Journal) -> set[str]:
    """The files a kernel journal's steps backed up before writing them and its undo restores (not the modprobe.d
    file, which rollback rewrites for the kernels left), not undone yet."""
    return {b.path for step in journal.state().steps if not step.undone for b in restored(step)}


def refuse_under_a_later_install(journal: Journal) -> None:
    """One kernel's install undone alone must not pull files from under a later install that wrote them again
    (the boot guard's and the stock loader's serve every kernel): that install's journal holds this one's
    files as its backup, and relies on them being there. Undone newest first (`--all`), each gets back what it
    found."""
    mine = _written_files(journal)
    newest_first = kernel_journals_newest_first()
    later = newest_first[: [j.kernel for j in newest_first].index(journal.kernel)]
    for other in later:
        shared = sorted(mine & _written_files(other))
        if shared:
            raise UsageError(
                f"{other.kernel}'s later install rewrote {shared[0]}"
                + (f" and {len(shared) - 1} more file(s)" if len(shared) > 1 else "")
                + f" that {journal.kernel}'s install wrote: rolling back {journal.kernel} alone would take them"
                " from under it",
                f"roll back {other.kernel} first (rollback --kernel {other.kernel}), or every kernel with"
                " rollback --all; nothing was changed",
            )


def kernel_journals_newest_first() -> list[Journal]:
    return sorted((Journal(k) for k in Journal.kernels()), key=_started, reverse=True)


def kernels_to_roll_back(kernel: str | None) -> list[Journal]:
    if kernel is not None:
        journal = Journal(user_input.kernel_release(kernel))
        return [journal] if journal.exists() else []
    # The experiment's boots first: the newest layer (its GRUB lines sit on top of the boot guard's).
    experiment, parameters, profile = ExperimentJournal(), ParameterJournal(), ProfileJournal()
    return (
        ([experiment] if experiment.exists() else [])
        + kernel_journals_newest_first()
        + [j for j in (parameters, profile) if j.exists()]
    )


@dataclass(frozen=True)
class RollbackResult:
    """What `rdna1-kmgr rollback` did or would do; --json is its fields (message, plan, done: only the outcomes
    that have them)."""

    nothing_installed: bool
    kernels: list[str]  # the journals rolled back (or planned), by the kernel or layer they belong to
    dry_run: bool
    message: str | None = optional()  # nothing installed: where no journal was found
    plan: list[str] | None = optional()
    done: dict[str, list[str]] | None = optional()  # each journal's lines, as they were replayed


def run(
    kernel: str | None,
    keep_build: bool = False,
    dry_run: bool = False,
    confirm: Callable[[list[str]], bool] | None = None,
) -> RollbackResult:
    """Everything `rdna1-kmgr rollback` does. Its lines go to progress."""
    refuse_if_busy()
    journals = kernels_to_roll_back(kernel)
    plans = {j.kernel: plan_for(j, keep_build) for j in journals}  # refuses a corrupted journal here
    if kernel is not None and journals:
        refuse_under_a_later_install(journals[0])
    if not journals:
        where = f" for {kernel}" if kernel else ""
        message = f"nothing installed by rdna1-kmgr{where}: no journal under {journal_root()}"
        return RollbackResult(nothing_installed=True, kernels=[], dry_run=dry_run, message=message)
    lines = [line for plan in plans.values() for line in plan]
    if dry_run:
        return RollbackResult(nothing_installed=False, kernels=list(plans), dry_run=True, plan=lines)
    if confirm is not None and not confirm(lines):
        raise UsageError("not confirmed", "nothing was changed; pass --yes to roll back without asking")
    done = {}
    with locked("rollback" + (f" --kernel {kernel}" if kernel else "")):
        for journal in journals:
            if not journal.exists():
                continue  # another run finished it between the plan and the lock
            said = replay(journal, keep_build, reason="rdna1-kmgr rollback")
            for line in said:
                progress.say(f"rdna1-kmgr: {line}")
            done[journal.kernel] = said
    return RollbackResult(nothing_installed=False, kernels=list(done), dry_run=False, plan=lines, done=done)
