"""`rdna1-kmgr experiment`: the user-space cells on the host, one after another, and the answer.

Before anything runs: the input is checked (profiles, backends, the cell filter, --python), the board must be
there (an RDNA1 GPU in this machine: host/), and the owner is told the screen may freeze. Nothing on the
system changes: every file it writes is under the run's folder in the tool's state dir. A cell whose kernel log
says a GPU reset failed ends the experiment there: the record says so and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from rdna1_kmgr.core import program_env, progress
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.doctor import control_stack, kfd_access, queue_cwsr
from rdna1_kmgr.experiment import answer, cell_run, host_cells, owner_python
from rdna1_kmgr.experiment.host_record import HostContext, HostRecord
from rdna1_kmgr.host import host_facts, kmsg
from rdna1_kmgr.host.rdna1_boards import chip_of, format_id

# What a refused queue looks like from the workload: ROCr's HSA_STATUS_ERROR_OUT_OF_RESOURCES, or PyTorch's segfault
QUEUE_LIKE = ("queue-failed", "crash")
RESET_FAILED_TODO = (
    "the GPU did not come back after a reset: the experiment stopped. Save what you can, shut the "
    "machine down and power it off (a reboot may not reset the board), then run the experiment again "
    "with --cells to go on past the cells done (each is in the record)"
)


@dataclass(frozen=True)
class Request:
    python: str | None
    sysroot: Path
    profiles: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    pattern: str | None = None
    limits: cell_run.Limits = cell_run.Limits()
    quick: bool = False  # the workload's small shapes (a first look; the tests)


def workload_script() -> Path:
    """The one workload, qemu/guest/conv2d.py as the package ships it (the VMs run the same file)."""
    return Path(str(resources.files("rdna1_kmgr.qemu") / "guest" / "conv2d.py"))


def the_board(sysroot: Path):
    facts = host_facts.detect(sysroot)
    boards = facts.rdna1_devices
    if not boards:
        seen = ", ".join(f"{d.bdf} {d.vendor:04x}:{d.device:04x}" for d in facts.display_devices) or "none"
        raise HostError(
            f"no RDNA1 board in this machine (display devices: {seen}): the experiment runs PyTorch on "
            "the board itself, so nothing was run and nothing changed",
            "run it on the desktop with the RX 5600 XT; `rdna1-kmgr detect` lists what is seen",
        )
    return facts.target or boards[0]


def warn(line: str) -> None:
    """A line the owner must not miss (the display may freeze, a run stopped), under the tool's name."""
    progress.say(f"rdna1-kmgr: {line}")


@dataclass(frozen=True)
class HostRun:
    """The host experiment's outcome: the record it wrote (what --json prints) and the typed view of it."""

    record: HostRecord  # record.json of the run (answer.write)
    results: list[cell_run.HostResult]
    folder: str
    answer: list[str]  # the smallest change that passes, said in lines
    html: str  # the table page beside the record
    stopped: str | None  # a GPU reset failed: what to do (the run stopped)
    dead_end: str | None  # a cell could not run at all: why (the run stopped)


def run(request: Request) -> HostRun:
    cells = host_cells.select(request.profiles, request.backends, request.pattern)
    base_env = program_env.for_owner()  # the owner's, never root's (core/program_env.py)
    python = owner_python.given(request.python, base_env)  # the input first, then the machine
    board = the_board(request.sysroot)
    python = owner_python.ready(python, request.sysroot, base_env)
    folder = answer.new_run_dir()
    readable = kmsg.last_seq(request.sysroot) is not None
    warn(
        f"the board {board.bdf} ({chip_of(board.device) or format_id(board.device)}) is also your display: the "
        f"screen may freeze while a cell runs (up to {request.limits.case:g} s without progress per case, "
        f"{request.limits.cell:g} s per cell); a hung cell is killed by itself. Save your work first."
    )
    if not readable:
        warn("the kernel log cannot be read (run as root to see ring timeouts and GPU resets per cell)")
    progress.say(
        f"experiment: {len(cells)} cell(s), torch {python.torch} (HIP {python.hip}) of {python.path}; results in "
        f"{folder}"
    )
    # What doctor's queue finding reads first: KFD refusing the board's control stack makes a cell's crash or
    # failed queue that, not a fault of the workload.
    release = host_facts.detect(request.sysroot).kernel_release
    refusal = control_stack.refusal(
        kfd_access.read_nodes(request.sysroot), queue_cwsr.kernel_validates(request.sysroot, release)[0]
    )
    sweep = "experiment-quick" if request.quick else "experiment"  # the workload's cases (conv2d.py)
    results: list[cell_run.HostResult] = []
    stopped = dead_end = None
    for number, cell in enumerate(cells, 1):
        progress.say(f"[{number}/{len(cells)}] {cell.id} ...")
        result = cell_run.run_cell(
            cell,
            python.path,
            workload_script(),
            base_env,
            folder / "cells" / cell.id.replace("/", "--"),
            request.limits,
            request.sysroot,
            python.owner,
            sweep,
        )
        if refusal and result.outcome in QUEUE_LIKE:
            result = replace(result, outcome="queue-failed", detail=f"{result.detail}; {refusal}")
        results.append(result)
        progress.say(f"[{number}/{len(cells)}] {cell.id}: {result.outcome} ({result.seconds:.1f} s) {result.detail}")
        if refusal and result.outcome == "queue-failed":
            dead_end = answer.refused_queue(refusal)
            warn(dead_end)
            break
        if result.reset_failed:
            stopped = RESET_FAILED_TODO
            warn(stopped)
            break
        if result.outcome == answer.NOT_RUN:
            dead_end = answer.dead_end(result.detail)
            warn(dead_end)
            break
    best = answer.recommend(results)
    context = HostContext(
        board=board.bdf,
        python=python.path,
        owner=python.owner.name,
        torch=python.torch,
        hip=python.hip,
        kernel_log_readable=readable,
        limits=request.limits,
        sweep=sweep,
        planned=tuple(c.id for c in cells),
        stopped=stopped,
        dead_end=dead_end,
    )
    record = answer.write(folder, results, best, context)
    return HostRun(record, results, record.folder, list(record.answer), record.html, stopped, dead_end)
