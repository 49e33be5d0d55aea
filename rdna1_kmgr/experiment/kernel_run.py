"""`rdna1-kmgr experiment kernel|status|stop` and the boot step: the kernel axis, one boot per kernel cell.

`start` checks everything first (the board, GRUB, the owner's Python, the cells), writes the plan and the
boot files (journaled), and arms the first cell. At every boot after that the unit runs `boot_step`:

    this boot is the current cell's (rdna1_kmgr.cell= on its command line)   run the host cells, record them
    GRUB booted the current cell, but this boot is a normal one              that boot hung or was power-cycled:
                                                                             record a hang
    the current cell is armed                                                nothing yet (reboot to run it)

then arms the next cell, or, after the last, removes the boot files (the journal's replay, as `stop` does)
and writes the table. The host cells run as in stage 1 (cell_run.py), with the environment the owner had
when they started the experiment. Results live in the state folder (experiments/kernel-<time>/); nothing of the
experiment stays in /etc, /boot or grubenv once it has ended or been stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rdna1_kmgr.core import owner as owners
from rdna1_kmgr.core import program_env, runner
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.files import make_dirs, write_json
from rdna1_kmgr.core.output import optional
from rdna1_kmgr.core.progress import say
from rdna1_kmgr.experiment import answer, apply, boot_cells, cell_run, host_cells, host_run, owner_python
from rdna1_kmgr.experiment.kernel_cells import InstalledBuild, KernelCell
from rdna1_kmgr.experiment.kernel_cells import select as select_kernel_cells
from rdna1_kmgr.follow import status as install_status
from rdna1_kmgr.install import boot_guard, rollback
from rdna1_kmgr.install.journal import locked, refuse_if_busy
from rdna1_kmgr.install.journal_records import ExperimentBegin
from rdna1_kmgr.install.profile_journal import ExperimentJournal
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.render.quirk_mask import QuirkMask
from rdna1_kmgr.userspace import profiles
from rdna1_kmgr.vm import cell_outcomes
from rdna1_kmgr.vm.experiment import experiments_dir

CURRENT = "kernel-current.json"  # points at the run under way
LATEST = apply.KERNEL_LATEST  # the last finished or stopped run's record
BEST = 2  # stage 1's best cells run in each kernel cell's boot
# The cells run in the owner's environment as it was at `start` (the unit's own is systemd's), less what
# belongs to that login session and is stale at the next boot.
_SESSION = (
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
    "XDG_SESSION_ID",
    "DBUS_SESSION_BUS_ADDRESS",
    "SSH_AUTH_SOCK",
    "SSH_CLIENT",
    "SSH_CONNECTION",
    "SSH_TTY",
    "TERM",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "SUDO_COMMAND",
    "MAIL",
)
_STAGES = ["smoke", "conv2d", "variants", "batchnorm", "fp16", "sustained"]  # the workload's, in order


@dataclass(frozen=True)
class Plan:
    folder: str
    kernel_cells: tuple[KernelCell, ...]
    host_cells: tuple[str, ...]
    python: str
    sysroot: str
    environment: dict
    limits: cell_run.Limits
    quick: bool
    reboot: bool
    owner: dict  # who the cells run as, recorded at `start` (name, uid, gid): the boot unit drops to them

    def to_json(self) -> dict:
        return {
            "folder": self.folder,
            "kernel_cells": [c.to_json() for c in self.kernel_cells],
            "host_cells": list(self.host_cells),
            "python": self.python,
            "sysroot": self.sysroot,
            "environment": self.environment,
            "limits": {"case": self.limits.case, "cell": self.limits.cell},
            "quick": self.quick,
            "reboot": self.reboot,
            "owner": self.owner,
        }

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        return cls(
            data["folder"],
            tuple(KernelCell.from_json(c) for c in data["kernel_cells"]),
            tuple(data["host_cells"]),
            data["python"],
            data["sysroot"],
            data["environment"],
            cell_run.Limits(**data["limits"]),
            data["quick"],
            data["reboot"],
            data.get("owner") or {},  # a plan without one runs no cell (Owner.from_json says so)
        )


@dataclass(frozen=True)
class Request:
    python: str | None
    sysroot: Path
    kernel_cells: tuple[str, ...] = ()
    host_pattern: str | None = None
    limits: cell_run.Limits = cell_run.Limits()
    quick: bool = False
    reboot: bool = False


# --- which cells ------------------------------------------------------------------------------------------------


def best_host_cells(record: dict | None, count: int = BEST) -> list[str]:
    """Stage 1's best cells: those that passed, then those that got furthest through the workload (the stage
    they stopped at, in the workload's order); ties in the record's order (the profile file's, least change
    first). Without a record: PyTorch as installed."""
    if not record or not record.get("cells"):
        return [f"as-installed/{cell_outcomes.DEFAULT_BACKEND}"]

    def reached(cell: dict) -> int:
        if cell.get("outcome") == "pass":
            return len(_STAGES)
        return _STAGES.index(cell["stage"]) if cell.get("stage") in _STAGES else -1

    ordered = sorted(record["cells"], key=lambda c: -reached(c))  # sorted() is stable: ties keep their order
    return [c["cell"] for c in ordered[:count]]


def chosen_host_cells(pattern: str | None) -> list[host_cells.HostCell]:
    ids = [c.id for c in host_cells.select(pattern=pattern)] if pattern else best_host_cells(answer.read_latest())
    by_id = {c.id: c for c in host_cells.select()}
    return [by_id[i] for i in ids if i in by_id]


def installed_build(root: TargetRoot) -> InstalledBuild | None:
    """The patched build's bits when it is what the running kernel loaded (its rdna1_quirks parameter exists)."""
    loaded = root.sys_module / "amdgpu/parameters/rdna1_quirks"
    if not loaded.is_file():
        return None
    for kernel in install_status.run().kernels:
        if not kernel.running or not kernel.journal:
            continue
        for build in kernel.built:  # the one the journal installed
            quirks = build.get("quirks") or {}
            if (
                build["version"] == kernel.journal.get("version")
                and isinstance(quirks.get("mask"), int)
                and isinstance(quirks.get("default_mask"), int)
            ):
                return InstalledBuild(QuirkMask(quirks["default_mask"]), QuirkMask(quirks["mask"]))
    return None


# What a cell's process needs of the owner's environment besides the variables the profiles set or unset:
# where programs are, the home, the locale, and the ROCm and PyTorch stacks' own settings. Nothing else of the
# environment `start` ran in (root's, through sudo: tokens, keys, passwords) goes into plan.json.
# PYTHONPATH: what the owner's Python loads beside its venv, as the host cells get it; the cell runs as the owner.
# The allow-list is core/program_env.py's (owners_stack), the host cells' too.


def owner_environment(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` a cell needs (plan.json keeps these): program_env's allow-list of the owner's stack
    and every name a profile sets or unsets, less what belongs to the login session."""
    profile_names = {name for p in profiles.load().values() for name in (*p.set, *p.unset)}
    stack = program_env.owners_stack(env)
    return {k: v for k, v in env.items() if k not in _SESSION and (k in stack or k in profile_names)}


# --- state ------------------------------------------------------------------------------------------------------


def current_plan() -> Plan | None:
    try:
        folder = Path(json.loads((experiments_dir() / CURRENT).read_text())["folder"])
        return Plan.from_json(json.loads((folder / "plan.json").read_text()))
    except (OSError, ValueError, KeyError):
        return None


def progress(plan: Plan) -> list[dict]:
    try:
        return json.loads((Path(plan.folder) / "progress.json").read_text())
    except (OSError, ValueError):
        return []


def _record_event(plan: Plan, **event) -> None:
    events = progress(plan) + [{"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **event}]
    write_json(Path(plan.folder) / "progress.json", events, indent=1)


def finished_cells(events: list[dict]) -> dict[str, dict]:
    return {e["cell"]: e for e in events if e.get("event") in ("ran", "hang")}


def current_cell(plan: Plan, events: list[dict]) -> KernelCell | None:
    done = finished_cells(events)
    return next((c for c in plan.kernel_cells if c.name not in done), None)


def decide(current: str | None, this_cell: str | None, grub_state: str | None, grub_name: str | None) -> str:
    """What the boot step does: run, hang, wait, rearm, or nothing."""
    if current is None:
        return "nothing"
    if this_cell is not None:
        return "run" if this_cell == current else "nothing"
    if grub_state == "booted" and grub_name == current:
        return "hang"
    if grub_state == "armed" and grub_name == current:
        return "wait"
    return "rearm"  # the block lost the cell (edited by hand, or a write GRUB could not make): arm it again


# --- the commands -----------------------------------------------------------------------------------------------


def new_run_folder() -> Path:
    """experiments/kernel-<time>, of this run alone: a start in the same second as an earlier one (right after a
    `stop`) gets -2, -3... after the time, so its record never carries the earlier run's events."""
    stamp = experiments_dir() / f"kernel-{time.strftime('%Y%m%dT%H%M%S')}"
    folder, n = stamp, 2
    while folder.exists():
        folder, n = stamp.with_name(f"{stamp.name}-{n}"), n + 1
    return folder


@dataclass(frozen=True)
class Started:
    """`experiment kernel`: the cells and boot files planned (and, without --dry-run, the first one armed)."""

    dry_run: bool
    plan: list[str]
    kernel_cells: list[dict]
    host_cells: list[str]
    board: str
    python: str
    owner: str
    folder: str | None = optional()  # the run's folder, once started


@dataclass(frozen=True)
class Stopped:
    """`experiment stop`; --json: running, and message or dry_run and plan, then done or record as it went."""

    running: bool
    message: str | None = optional()  # nothing under way
    dry_run: bool | None = optional()
    plan: list[str] | None = optional()
    done: list[str] | None = optional()  # the journal's replay, when no plan was readable
    record: dict | None = optional()  # the run's record, ended


@dataclass(frozen=True)
class CellState:
    cell: str
    parameter: str
    state: str | None  # done, armed (or what GRUB's variables say: None when they name the cell, no state), waiting
    outcomes: list[str] | None = optional()  # done: each host cell's outcome, or hang


@dataclass(frozen=True)
class CellsUnderWay:
    """`experiment status` while kernel cells are under way."""

    folder: str
    host_cells: list[str]
    cells: list[CellState]
    boot_files: bool  # GRUB's script for the cells' boots is in place
    running: bool = True


@dataclass(frozen=True)
class NoCellsUnderWay:
    """`experiment status` with no kernel cells under way: the last run's record, if one finished."""

    latest: dict | None
    running: bool = False

    def last_run(self) -> tuple[str, list[str]] | None:
        """The last run's folder, and its table and answer as the record holds them."""
        if self.latest is None:
            return None
        return self.latest["folder"], self.latest["table"] + [""] + self.latest["answer"]


def start(request: Request, dry_run: bool) -> Started:
    root = TargetRoot.from_env()
    refuse_if_busy()
    running = current_plan()
    if running is not None:
        raise UsageError(
            f"an experiment's kernel cells are under way ({running.folder})",
            "`rdna1-kmgr experiment status` says where it is; `rdna1-kmgr experiment stop` ends it",
        )
    hosts = chosen_host_cells(request.host_pattern)  # the input first, then the machine
    kernel_cells = select_kernel_cells(request.kernel_cells, installed_build(root))
    env = program_env.for_owner()
    python = owner_python.given(request.python, env)
    board = host_run.the_board(request.sysroot)
    why = boot_cells.unavailable(root)
    if why:
        raise UsageError(f"kernel cells are boots through GRUB, and {why}", "nothing was changed")
    guard = boot_guard.env_values(root).get(boot_guard.STATE) if boot_guard.installed(root) else None
    if guard in ("trial", "trying") and boot_guard.this_boot(root) != "trial":
        raise UsageError(
            "the boot guard's trial boot is pending",
            "boot it and let it confirm (or `rdna1-kmgr " "confirm`) first; nothing was changed",
        )
    python = owner_python.ready(python, request.sysroot, env)
    lines = [
        f"kernel cells (one boot each, in this order; {len(hosts)} host cell(s) in each: "
        f"{', '.join(c.id for c in hosts)}):"
    ]
    lines += [f"  {n}. {c.name}: {c.parameter}   {c.summary}" for n, c in enumerate(kernel_cells, 1)]
    lines += ["boot files:"] + [f"  {line}" for line in boot_cells.plan_lines(root, kernel_cells[0])]
    lines.append(f"journal: {ExperimentJournal().path}")
    result = Started(
        dry_run=dry_run,
        plan=lines,
        kernel_cells=[c.to_json() for c in kernel_cells],
        host_cells=[c.id for c in hosts],
        board=board.bdf,
        python=python.path,
        owner=python.owner.name,
    )
    if dry_run:
        return result
    folder = new_run_folder()
    plan = Plan(
        str(folder),
        tuple(kernel_cells),
        tuple(c.id for c in hosts),
        python.path,
        str(request.sysroot),
        owner_environment(env),
        request.limits,
        request.quick,
        request.reboot,
        python.owner.to_json(),
    )
    with locked("experiment kernel"):
        make_dirs(folder)
        write_json(folder / "plan.json", plan.to_json(), indent=1)
        journal = ExperimentJournal()
        journal.begin(ExperimentBegin(str(folder), tuple(c.name for c in kernel_cells)))
        write_json(experiments_dir() / CURRENT, {"folder": str(folder)})
        boot_cells.install(root, journal, kernel_cells[0])
        _record_event(plan, cell=kernel_cells[0].name, event="armed")
    say(
        f"cell 1 of {len(kernel_cells)} ({kernel_cells[0].name}: {kernel_cells[0].parameter}) is armed: reboot to "
        "run it; each boot after it runs the next cell (`rdna1-kmgr experiment status`; `experiment stop` ends it)"
    )
    host_run.warn(
        "the board is your display: during a cell's boot the screen may freeze while the workload runs; a boot "
        "that hangs can be power-cycled, it is recorded as a hang and the boot after it is a normal one"
    )
    return replace(result, folder=str(folder))


def boot_step() -> dict:
    """At every boot (the unit): run, record, arm the next, or end the experiment."""
    root = TargetRoot.from_env()
    plan = current_plan()
    if plan is None:
        return {"action": "nothing", "why": "no experiment under way"}
    events = progress(plan)
    cell = current_cell(plan, events)
    state, name = boot_cells.env_state(root)
    action = decide(cell.name if cell else None, boot_cells.this_cell(root), state, name)
    number = plan.kernel_cells.index(cell) + 1 if cell else len(plan.kernel_cells)
    total = len(plan.kernel_cells)
    if action == "nothing":
        return {"action": action, "why": "this boot is no cell's to run"}
    assert cell is not None, "decide gives nothing to do when no cell is left"
    if action == "wait":
        say(f"rdna1-kmgr experiment: cell {number} of {total} ({cell.name}) is armed: reboot to run it")
        return {"action": action, "cell": cell.name}
    if action == "rearm":
        with locked("experiment boot-step"):
            boot_cells.arm(root, cell)
            _record_event(plan, cell=cell.name, event="armed")
        say(f"rdna1-kmgr experiment: cell {number} of {total} ({cell.name}) armed again: reboot to run it")
        return {"action": action, "cell": cell.name}
    stopped = None
    if action == "hang":
        _record_event(plan, cell=cell.name, event="hang")
        say(
            f"rdna1-kmgr experiment: cell {number} of {total} ({cell.name}): its boot never came back to record "
            "(a hang, or the machine was power-cycled): recorded as a hang; this boot is a normal one"
        )
    else:
        results = _run_host_cells(plan, cell, root, number, total)
        _record_event(
            plan,
            cell=cell.name,
            event="ran",
            cmdline=root.proc_cmdline.read_text().strip(),
            results=[r.to_json() for r in results],
        )
        if any(r.reset_failed for r in results):
            stopped = host_run.RESET_FAILED_TODO
    if current_plan() != plan:  # `experiment stop` ended it while the cells ran: arm nothing
        return {"action": action, "cell": cell.name, "stopped": True}
    following = current_cell(plan, progress(plan))
    if following is None or stopped:
        record = end(plan, root, stopped or "")
        return {"action": action, "cell": cell.name, "finished": True, "record": record}
    with locked("experiment boot-step"):
        if current_plan() != plan:
            return {"action": action, "cell": cell.name, "stopped": True}
        boot_cells.arm(root, following)
        _record_event(plan, cell=following.name, event="armed")
    say(
        f"rdna1-kmgr experiment: next, cell {plan.kernel_cells.index(following) + 1} of {total} "
        f"({following.name}: {following.parameter}) is armed: " + ("rebooting" if plan.reboot else "reboot to run it")
    )
    if plan.reboot:
        runner.run(["systemctl", "reboot"], check=False)
    return {"action": action, "cell": cell.name, "next": following.name}


def _run_host_cells(plan: Plan, cell: KernelCell, root: TargetRoot, number: int, total: int) -> list:
    by_id = {c.id: c for c in host_cells.select()}
    sweep = "experiment-quick" if plan.quick else "experiment"
    # The unit is root's: the cells drop to the owner recorded at `start`, still that user, with a venv that
    # still nobody else can change (checked again: it may have changed hands since).
    owner = owners.of_python(plan.python, owners.Owner.from_json(plan.owner))
    results = []
    for host_id in plan.host_cells:
        say(f"rdna1-kmgr experiment: cell {number} of {total} ({cell.name}), {host_id} ...")
        folder = Path(plan.folder) / "cells" / cell.name / host_id.replace("/", "--")
        result = cell_run.run_cell(
            by_id[host_id],
            plan.python,
            host_run.workload_script(),
            dict(plan.environment),
            folder,
            plan.limits,
            Path(plan.sysroot),
            owner,
            sweep,
        )
        say(
            f"rdna1-kmgr experiment: cell {number} of {total} ({cell.name}), {host_id}: {result.outcome} "
            f"{result.detail}"
        )
        results.append(result)
        if result.reset_failed:
            break
    return results


def end(plan: Plan, root: TargetRoot, why: str) -> dict:
    """Remove the boot files (the journal's replay), write the record and the table, forget the plan."""
    with locked("experiment end"):
        if current_plan() != plan:  # ended meanwhile (stop, or the boot step): its record is written
            return answer.read_json(experiments_dir() / LATEST) or {}
        journal = ExperimentJournal()
        if journal.exists():
            for line in rollback.replay(journal, keep_build=True, reason=why or "the experiment's last cell ran"):
                say(f"rdna1-kmgr experiment: {line}")
        boot_cells.daemon_reload(root)
        record = answer.write_kernel_record(plan, progress(plan), why)
        write_json(experiments_dir() / LATEST, record, indent=1)
        (experiments_dir() / CURRENT).unlink(missing_ok=True)
    for line in record["table"] + [""] + record["answer"] + [f"table: {record['html']}"]:
        say(line)
    return record


def stop(dry_run: bool) -> Stopped:
    root = TargetRoot.from_env()
    refuse_if_busy()
    plan = current_plan()
    journal = ExperimentJournal()
    if plan is None and not journal.exists():
        return Stopped(running=False, message="no experiment's kernel cells are under way: nothing to stop")
    lines = rollback.plan_for(journal, keep_build=True) if journal.exists() else []
    if dry_run:
        return Stopped(running=True, dry_run=True, plan=lines)
    if plan is None:  # a start killed before its plan was readable: the journal alone
        with locked("experiment stop"):
            said = rollback.replay(journal, keep_build=True, reason="rdna1-kmgr experiment stop")
        return Stopped(running=True, dry_run=False, plan=lines, done=said)
    _record_event(plan, cell="-", event="stopped")
    record = end(plan, root, "stopped by `rdna1-kmgr experiment stop`")
    return Stopped(running=True, dry_run=False, plan=lines, record=record)


def status() -> CellsUnderWay | NoCellsUnderWay:
    plan = current_plan()
    if plan is None:
        return NoCellsUnderWay(answer.read_json(experiments_dir() / LATEST))
    root = TargetRoot.from_env()
    events = progress(plan)
    done = finished_cells(events)
    cell = current_cell(plan, events)
    state, name = boot_cells.env_state(root)
    cells = []
    for c in plan.kernel_cells:
        if c.name in done:
            event = done[c.name]
            outcomes = [r["outcome"] for r in event.get("results", [])] if event["event"] == "ran" else ["hang"]
            cells.append(CellState(c.name, c.parameter, "done", outcomes))
        elif cell is not None and c.name == cell.name:
            cells.append(CellState(c.name, c.parameter, state if name == c.name else "armed?"))
        else:
            cells.append(CellState(c.name, c.parameter, "waiting"))
    return CellsUnderWay(
        folder=plan.folder,
        host_cells=list(plan.host_cells),
        cells=cells,
        boot_files=boot_cells.installed(root),
    )
