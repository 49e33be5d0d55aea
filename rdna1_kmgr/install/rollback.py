"""`rdna1-kmgr rollback`: replay a kernel's journal backwards, exactly, as often as it takes.

For each step of the install, newest first, that is not undone yet: reverse what is not a file (`dkms
uninstall` when DKMS still lists the module installed), put every backed-up file back byte for byte (or remove
it when it was absent before), remove the directories the step created, run what regenerates from the
restored files (the boot guard's `update-grub`), and record `undone`. Every action
looks at the current state first, so a rollback killed anywhere, or an install killed anywhere (even inside a
step), is finished by running rollback again.

Then: the install's DKMS package is removed for that kernel (its source too when no other kernel uses it)
unless --keep-build; when the module index was touched (and existed before), depmod runs once more (the result
equals the
restored index, unless other modules were added meanwhile, which a plain restore would hide); `rolled-back`
is recorded and the journal moves to history/.
"""

from __future__ import annotations

import datetime
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import progress, runner, user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.output import optional
from rdna1_kmgr.install import journal_checks, journal_programs, modprobe_conf
from rdna1_kmgr.install.journal import (
    Journal,
    JournalError,
    State,
    StepState,
    abort_point,
    journal_root,
    locked,
    refuse_if_busy,
    remove_created_dirs,
)
from rdna1_kmgr.install.profile_journal import ExperimentJournal, ParameterJournal, ProfileJournal
from rdna1_kmgr.modbuild import dkms_package as dkms


def _undo_lines(step, keep_build: bool) -> list[str]:
    record = step.intent
    lines = [f"undo {step.step}" + ("" if step.done else " (it was interrupted)") + ":"]
    undo = record.get("undo") or {}
    if undo.get("kind") == "dkms-uninstall":
        lines.append(f"    {' '.join(undo['command'])}   (if DKMS lists it installed)")
    if undo.get("kind") == "modprobe-conf":
        lines.append(f"    {modprobe_conf.undo_plan(Path(undo['path']), undo['kernel'])}")
    for entry in restored(record):
        if entry["backup"] is None and "symlink" not in entry:
            lines.append(f"    remove {entry['path']} (if present)")
        else:
            lines.append(f"    restore {entry['path']} from the journal's backup")
    for folder in sorted(record["dirs"], key=lambda d: d.count("/"), reverse=True):
        lines.append(f"    remove the directory {folder} (if empty)")
    for command in undo.get("after", []):
        lines.append(f"    {' '.join(command)}")
    return lines


def restored(intent: dict) -> list[dict]:
    """The backups a step's undo puts back, newest first; the shared modprobe.d file is rewritten instead."""
    shared = (intent.get("undo") or {}).get("kind") == "modprobe-conf"
    return [] if shared else list(reversed(intent["backups"]))


def _package_of(state: State) -> tuple[dkms.Package, dkms.Trees, str] | None:
    begin = state.begin or {}
    if not begin.get("package") or not begin.get("version"):
        return None
    trees = begin.get("trees") or {}
    return (
        dkms.Package(begin["package"], begin["version"]),
        dkms.Trees(source=Path(trees.get("source", "/usr/src")), dkms=Path(trees.get("dkms", "/var/lib/dkms"))),
        begin["kernel"],
    )


def _final_depmod(state: State) -> list[str] | None:
    """The depmod of the install, when the module index may have been touched and there was one before: a
    kernel whose image is not installed had no index (modules.dep absent), and restoring leaves none."""
    for step in state.steps:
        if step.step == "depmod" and step.intent.get("command"):
            had_index = any(
                Path(b["path"]).name == "modules.dep" and (b.get("backup") or "symlink" in b)
                for b in step.intent.get("backups", [])
            )
            return step.intent["command"] if had_index else None
    return None


def plan_for(journal: Journal, keep_build: bool) -> list[str]:
    """The exact rollback of one kernel's journal, in order (changes nothing); a record replay could not trust
    is refused here (journal_checks)."""
    journal_checks.check(journal)
    state = journal.state()
    begin = state.begin or {}
    if isinstance(journal, ProfileJournal):
        lines = [f"user-space profile {begin.get('profile', '?')}: {state.description} (journal {journal.path})"]
    elif isinstance(journal, ExperimentJournal):
        lines = [f"the experiment's kernel-cell boots: {state.description} (journal {journal.path})"]
    elif isinstance(journal, ParameterJournal):
        lines = [f"kernel parameter {begin.get('parameter', '?')}: {state.description} (journal {journal.path})"]
    else:
        lines = [
            f"kernel {journal.kernel}: {begin.get('package', '?')}/{begin.get('version', '?')}, "
            f"{state.description} (journal {journal.path})"
        ]
    for step in reversed(state.steps):
        if not step.undone:
            lines += [f"  {line}" for line in _undo_lines(step, keep_build)]
    package = _package_of(state)
    if package and not keep_build:
        pkg, trees, kernel = package
        lines.append(f"  {' '.join(dkms.command(dkms.remove_args(pkg, kernel), trees))}   (if DKMS lists it)")
        lines.append(f"    remove {pkg.source_dir(trees)} when no other kernel uses {pkg.ref}")
    elif package:
        lines.append(f"  keep the build {package[0].ref} (--keep-build)")
    depmod = _final_depmod(state)
    if depmod:
        lines.append(f"  {' '.join(depmod)}")
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
        said += _replay(journal, state, keep_build, reason)
    history = journal.archive()
    said.append(f"rolled back {journal.kernel}; journal kept as {history}")
    return said


def _replay(journal: Journal, state: State, keep_build: bool, reason: str) -> list[str]:
    said = []
    journal.append("rollback", reason=reason, keep_build=keep_build)
    for step in reversed(state.steps):
        if step.undone:
            continue
        said += undo_step(journal, step)
        journal.append("undone", step=step.step, of=step.seq)
        abort_point(f"undo-{step.step}")
    package = _package_of(state)
    if package and not keep_build:
        pkg, trees, kernel = package
        if shutil.which("dkms"):
            dkms.remove(pkg, trees, kernel)
            said.append(f"removed the DKMS package {pkg.ref} for {kernel}")
        journal.append("rollback-step", step="remove-package")
        abort_point("remove-package")
    depmod = _final_depmod(state)
    if depmod:
        _run(depmod, "depmod")
        said.append(f"regenerated the module index: {' '.join(depmod)}")
        journal.append("rollback-step", step="depmod")
        abort_point("final-depmod")
    journal.append("rolled-back")
    return said


def undo_step(journal: Journal, step: StepState) -> list[str]:
    """Undo one step: what is not a file, its files put back, its folders removed, then what regenerates."""
    said = []
    undo = step.intent.get("undo") or {}
    if undo.get("kind") == "dkms-uninstall":
        said += _dkms_uninstall(undo)
    if undo.get("kind") == "modprobe-conf":
        said.append(modprobe_conf.sync(Path(undo["path"]), exclude=undo["kernel"]))
    for entry in restored(step.intent):
        said.append(journal.restore(entry))
    for folder in remove_created_dirs(step.intent["dirs"]):
        said.append(f"removed the directory {folder}")
    for command in undo.get("after", []):  # what regenerates from the restored files (GRUB's configuration)
        _run(command, command[0])
        said.append(" ".join(command))
    return [f"undo {step.step}: {line}" for line in said]


def _dkms_uninstall(undo: dict) -> list[str]:
    if not shutil.which("dkms"):
        return ["dkms is not installed any more: the module file is removed below, DKMS's own record stays"]
    trees = dkms.Trees(source=Path(undo["trees"]["source"]), dkms=Path(undo["trees"]["dkms"]))
    installed = any(
        e.version == undo["version"] and e.kernel == undo["kernel"] and e.state == "installed"
        for e in dkms.status(undo["package"], trees)
    )
    if not installed:
        return [f"{undo['package']}/{undo['version']} is not installed in DKMS for {undo['kernel']}"]
    _run(undo["command"], "dkms uninstall")
    return [" ".join(undo["command"])]


def _run(command: list[str], what: str) -> None:
    runner.run(command, timeout=900, doing=f"{what} during rollback", hint="fix the cause and run rollback again")


# --- the command -------------------------------------------------------------------------------------------


def _started(journal: Journal) -> tuple[datetime.datetime, str]:
    """When the journal's install began, to undo the newest first: a later install (follow's, for a new kernel)
    backs up the files an earlier one wrote (the boot guard's), so undoing it first puts those back as the
    earlier install left them, and the earlier one's undo then returns them to before both. Oldest when
    unreadable (plan_for refuses it with the reason)."""
    try:
        records = journal.records()
        started = datetime.datetime.strptime(records[0]["time"], "%Y-%m-%dT%H:%M:%S%z")
    except (JournalError, IndexError, KeyError, TypeError, ValueError):
        started = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    return started, journal.kernel


def _written_files(journal: Journal) -> set[str]:
    """The files a kernel journal's steps backed up before writing them and its undo restores (not the modprobe.d
    file, which rollback rewrites for the kernels left), not undone yet."""
    return {b["path"] for step in journal.state().steps if not step.undone for b in restored(step.intent)}


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
