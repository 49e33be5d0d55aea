"""One cell on the host: the workload in a fresh process of the owner's PyTorch, watched, then classified.

The process runs as the owner (core/owner.py), never as root: the interpreter and all it loads are the owner's.
It gets the cell's environment (its profile over the owner's), its own MIOpen caches (MIOPEN_USER_DB_PATH,
MIOPEN_CUSTOM_CACHE_DIR: no find result leaks from one cell into another) in a fresh folder the owner owns
(the cell's record folder is root's, in root's state), and the backend setting as workload arguments. It runs in
a session of its own (core/runner.run_session), so a hung cell is killed with its whole process group. The
kernel log and the time limits stay root's.

A case may take long: MIOpen compiles a kernel the first time it needs it, for minutes, printing nothing.
The workload says when each case starts and beats once a second; the cell is a hang only when a case has
made no progress for `Limits.case` seconds, progress being a new case or the cell's MIOpen caches growing
(a compilation writes there). `Limits.cell` is the backstop for the whole cell.

The kernel log is read before, during (each second) and after the cell: a ring timeout or a GPU reset in it
is the cell's outcome whatever the workload said; a reset that failed stops the cell at once, and the
experiment after it (the GPU is gone until the machine restarts).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.files import write_atomic
from rdna1_kmgr.core.owner import Owner
from rdna1_kmgr.doctor import compute_hangs
from rdna1_kmgr.experiment.host_cells import HostCell
from rdna1_kmgr.host import gpu_faults, kmsg
from rdna1_kmgr.vm import cell_outcomes

EVENT = "@@rdna1-kmgr "  # the workload's event lines (qemu/guest/conv2d.py)
RESET_FAILED = re.compile(
    r"GPU reset\(\d+\) failed|GPU reset failed|GPU Recovery Failed|ASIC reset failed|"
    r"failed to (?:reset|recover) (?:the )?GPU",
    re.I,
)
RING = re.compile(r"ring \S+ timeout", re.I)
STARTUP = 120.0  # seconds before the first case: the interpreter, torch and the ROCm libraries load
# Where each cell's folder for the owner is made: root's state folders are root's alone; a fresh folder in
# /var/tmp (sticky, kept over a reboot for the kernel cells) is the owner's to write, and to look at after.
SCRATCH = Path("/var/tmp")


@dataclass(frozen=True)
class Limits:
    case: float = 300.0  # seconds a case may go without progress
    cell: float = 3600.0  # seconds for the whole cell, progress or not


@dataclass(frozen=True)
class HostResult:
    cell: HostCell
    outcome: str
    detail: str
    stage: str | None  # the stage it stopped at; None when every stage passed
    case: str | None  # the first failing case
    max_error: float | None
    seconds: float
    versions: dict = field(default_factory=dict)
    kernel_log: tuple[str, ...] = ()
    beats: int = 0
    folder: str = ""
    reset_failed: bool = False
    caches: str = ""  # the owner's folder with the cell's MIOpen caches

    def to_json(self) -> dict:
        return {
            "cell": self.cell.id,
            "profile": self.cell.profile.name,
            "backend": self.cell.backend.name,
            "outcome": self.outcome,
            "detail": self.detail,
            "stage": self.stage,
            "case": self.case,
            "max_error": self.max_error,
            "seconds": self.seconds,
            "versions": self.versions,
            "kernel_log": list(self.kernel_log),
            "heartbeats": self.beats,
            "folder": self.folder,
            "reset_failed": self.reset_failed,
            "caches": self.caches,
        }


def kernel_log_reader(sysroot: Path) -> Callable[[], list[str]]:
    """A function giving the GPU hang, reset and page-fault lines the kernel logged since this call."""
    start = kmsg.last_seq(sysroot)

    def read() -> list[str]:
        return [
            r.message
            for r in kmsg.since(start, sysroot)
            if compute_hangs.is_hang(r.message) or RESET_FAILED.search(r.message) or gpu_faults.is_fault(r.message)
        ]

    return read


class Monitor:
    """Reads the workload's events as they come and decides, each poll, whether the cell must stop."""

    def __init__(
        self,
        limits: Limits,
        caches: list[Path],
        kernel_log: Callable[[], list[str]],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limits, self.caches, self.kernel_log, self.clock = limits, caches, kernel_log, clock
        self.progress_at = self.checked_at = clock()
        self.case: str | None = None
        self.stage: str | None = None
        self.beats = 0
        self.cache_bytes = 0
        self.versions: dict = {}
        self.stopped: str | None = None  # "hang", "reset-failed"
        self.log_lines: list[str] = []
        self._partial = ""

    def feed(self, chunk: str) -> bool:
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.startswith(EVENT):
                continue
            try:
                event = json.loads(line[len(EVENT) :])
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "case":
                self.case, self.stage, self.progress_at = event.get("case"), event.get("stage"), self.clock()
            elif kind == "beat":
                self.beats += 1
            elif kind == "versions":
                self.versions = {k: v for k, v in event.items() if k != "event"}
        return False

    def until(self) -> bool:
        now = self.clock()
        if now - self.checked_at >= 1.0:
            self.checked_at = now
            size = sum(_bytes_in(folder) for folder in self.caches)
            if size != self.cache_bytes:  # MIOpen wrote a compiled kernel or a find result: progress
                self.cache_bytes, self.progress_at = size, now
            self.log_lines = self.kernel_log()
            if any(RESET_FAILED.search(line) for line in self.log_lines):
                self.stopped = "reset-failed"
                return True
        limit = self.limits.case if self.case is not None else max(self.limits.case, STARTUP)
        if now - self.progress_at > limit:
            self.stopped = "hang"
            return True
        return False


def owner_folder(owner: Owner, script: Path) -> Path:
    """A fresh folder `owner` owns, with the MIOpen caches' folders and a copy of the workload (the tool's own
    copy may sit where the owner cannot read). Made as root and handed over last, so nothing can be planted in
    it before: root writes nothing in it after."""
    scratch = Path(tempfile.mkdtemp(prefix="rdna1-kmgr-cell-", dir=SCRATCH))  # 0700 and root's until handed over
    made = [scratch / name for name in ("miopen-db", "miopen-cache", "triton-cache", "inductor-cache")]
    for path in made:
        path.mkdir()
    write_atomic(scratch / script.name, script.read_bytes(), 0o644)
    for path in (*made, scratch / script.name, scratch):
        os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
    return scratch


def run_cell(
    cell: HostCell,
    python: str,
    script: Path,
    base_env: dict[str, str],
    folder: Path,
    limits: Limits,
    sysroot: Path,
    owner: Owner,
    sweep: str = "experiment",
) -> HostResult:
    """Run one cell as `owner`, its record in `folder` (created; output.log stays there), its caches in a fresh
    folder of the owner's, and classify it."""
    folder.mkdir(parents=True, exist_ok=True)
    scratch = owner_folder(owner, script)
    db, cache = scratch / "miopen-db", scratch / "miopen-cache"
    # The triton stage's compilers keep their kernels here: none is reused from another cell (a profile such as
    # no-buffer-ops changes what Triton generates), and a long compilation grows them, which counts as progress.
    triton, inductor = scratch / "triton-cache", scratch / "inductor-cache"
    env = cell.environment(base_env)
    env.update(
        MIOPEN_USER_DB_PATH=str(db),
        MIOPEN_CUSTOM_CACHE_DIR=str(cache),
        TRITON_CACHE_DIR=str(triton),
        TORCHINDUCTOR_CACHE_DIR=str(inductor),
        RDNA1_KMGR_CELL=cell.id,
        PYTHONUNBUFFERED="1",
    )
    argv = [
        python,
        str(scratch / script.name),
        "--device",
        "cuda",
        "--sweep",
        sweep,
        *cell.backend.workload_args(),
        "--events",
        "--case-limit",
        f"{limits.case:g}",
    ]
    monitor = Monitor(limits, [db, cache, triton, inductor], kernel_log_reader(sysroot))
    output = folder / "output.log"
    ended = runner.run_session(
        argv, output, limits.cell, env=env, cwd=str(scratch), watch=monitor.feed, until=monitor.until, as_user=owner
    )
    log_lines = tuple(monitor.kernel_log())
    text = output.read_text(errors="replace")
    report = _report(text)
    outcome, detail, stage, case, worst = classify(ended, monitor, report, text, log_lines, limits)
    versions = (report or {}).get("versions") or monitor.versions
    return HostResult(
        cell,
        outcome,
        detail,
        stage,
        case,
        worst,
        round(ended.elapsed, 1),
        versions,
        log_lines,
        monitor.beats,
        str(folder),
        monitor.stopped == "reset-failed",
        str(scratch),
    )


def classify(
    ended: runner.Outcome, monitor: Monitor, report: dict | None, text: str, log_lines: tuple[str, ...], limits: Limits
) -> tuple[str, str, str | None, str | None, float | None]:
    """(outcome, detail, stage, case, max error): the kernel log first (the GPU itself hung), then the time
    limits, then the failure's own text, then the numbers."""
    cases = (report or {}).get("cases") or []
    # float32 cases only: float16's errors are of another scale (the report has each case's own)
    worst = max(
        (c["max_abs_err"] for c in cases if c.get("max_abs_err") is not None and c.get("stage") != "fp16"), default=None
    )
    where = monitor.stage, monitor.case
    if monitor.stopped == "reset-failed":
        line = next(line for line in log_lines if RESET_FAILED.search(line))
        return "gpu-reset", f"the GPU did not come back: {line}", *where, worst
    rings = [line for line in log_lines if RING.search(line)]
    hangs = [line for line in log_lines if not gpu_faults.is_fault(line)]
    faults = [line for line in log_lines if gpu_faults.is_fault(line)]
    if rings or hangs or faults:
        kind = "ring-timeout" if rings else "gpu-reset" if hangs else "memory-fault"
        # A workload that went on to its end cannot say which case the GPU hung in; one that did not stopped there.
        at = (None, None) if report is not None and report.get("ok") else where
        return kind, f"kernel log during the cell: {(rings or hangs or faults)[0]}", *at, worst
    if monitor.stopped == "hang" or ended.timed_out:
        limit = f"{limits.case:g} s without progress" if monitor.stopped == "hang" else f"the cell's {limits.cell:g} s"
        return (
            "hang",
            (
                f"killed after {limit} in {monitor.case or 'start-up'} ({monitor.beats} heartbeats, MIOpen "
                f"caches {monitor.cache_bytes} bytes)"
            ),
            *where,
            worst,
        )
    if report is None:
        code = ended.returncode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        kind = cell_outcomes.from_text(text) or "crash"
        return kind, f"the workload died ({how}) in {monitor.case or 'start-up'}: {_telling(text)}", *where, worst
    if "error" in report:
        return "not-run", report["error"], None, None, None
    failed = cell_outcomes.from_cases(cases)
    if failed is None:
        return "pass", f"{len(cases)} comparisons within tolerance" + _set_aside(cases), None, None, worst
    kind, first = failed
    stage = first.get("stage") or report.get("stopped_at")
    if kind == "wrong":
        bad = [c for c in cases if not c.get("ok")]
        return (
            kind,
            f"{len(bad)} of {len(cases)} off, first {first['case']} (error {first['max_abs_err']:.3g})",
            stage,
            first["case"],
            worst,
        )
    return kind, f"{first['case']}: {first.get('error', '')}", stage, first["case"], worst


def _set_aside(cases: list[dict]) -> str:
    """The cases the workload skipped or found not applicable, with why (no Triton; int8 without hipBLASLt):
    a pass says what it did not check."""
    aside = [c for c in cases if c.get("outcome") in ("skipped", "not-applicable")]
    return "".join(f"; {c['outcome']}: {c['case']} ({c.get('why') or c.get('error', '')})" for c in aside)


def _report(text: str) -> dict | None:
    """The workload's report: its last plain JSON line."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _telling(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(EVENT)]
    named = [line for line in lines if cell_outcomes.from_text(line)]
    return (named or lines or ["no output"])[-1][:300]


def _bytes_in(folder: Path) -> int:
    """The bytes of the plain files under the owner's `folder`: root only looks (lstat), follows no link."""
    total = 0
    for path in folder.rglob("*"):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total
