"""The experiment's answer: one table (text, JSON, an HTML page with the grid coloured by outcome) and the
smallest change that passes, for the host's cells.

The smallest change: fewest things the owner changes (nothing; a profile or a line of code; both), then the
profile file's order (the one that changes least first), then the backend's (PyTorch's default first).
Experiment controls (profiles marked experiment_only) are never recommended: they are there to compare.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.files import make_dirs, write_atomic, write_json
from rdna1_kmgr.experiment.cell_run import HostResult
from rdna1_kmgr.experiment.host_record import HostContext, HostRecord
from rdna1_kmgr.render.quirk_mask import KERNEL_PREFIX
from rdna1_kmgr.userspace import profiles as profile_data
from rdna1_kmgr.vm import cell_outcomes
from rdna1_kmgr.vm.experiment import CellResult, experiments_dir  # the VFIO matrix's records live there too

LATEST = "host-latest.json"


@dataclass(frozen=True)
class Row:
    cell: str
    kernel: str  # "as running" on the host; the quirk mask in the VFIO matrix
    profile: str
    backend: str
    outcome: str
    stopped_at: str  # "stage: case", or "-"
    max_error: float | None
    seconds: float | None
    detail: str


# A cell the workload could not start (no torch, or a torch that sees no GPU): no setting of the experiment can
# change that, so the experiment stops there and points at the doctor findings that explain it.
NOT_RUN = "not-run"


def dead_end(detail: str) -> str:
    """The experiment's stop when its first cell's precondition fails: the reason and the doctor findings."""
    if "sees no GPU" in detail:
        pointer = (
            "`rdna1-kmgr doctor` names the cause: access (your user on /dev/kfd and /dev/dri/renderD*), torch "
            "(a torch without gfx1010 code) or rocm-sdk (a missing device wheel)"
        )
    else:
        pointer = "`rdna1-kmgr doctor` names the cause (its torch finding)"
    return (
        f"stopped at the first cell, whose precondition failed: {detail}. No profile or backend setting can "
        f"change that, and the kernel axis is not the next step; {pointer}"
    )


def refused_queue(refusal: str) -> str:
    """The experiment's stop when KFD refuses the board's queues: no user-space setting can change that."""
    return (
        f"stopped: {refusal}. Every cell would fail the same way: no profile or backend setting reaches KFD's "
        "control-stack check"
    )


def host_row(result: HostResult) -> Row:
    return record_row(result.to_json())


def record_row(cell: dict) -> Row:
    """A host cell as the record keeps it (HostResult.to_json) as a row of the table."""
    stage, case = cell.get("stage"), cell.get("case")
    where = f"{stage}: {case}" if stage and case else (stage or "-")
    if cell["outcome"] == NOT_RUN:
        where = f"precondition: {cell.get('detail', '')}"
    return Row(
        cell["cell"],
        "as running",
        cell["profile"],
        cell["backend"],
        cell["outcome"],
        where,
        cell.get("max_error"),
        cell.get("seconds"),
        cell.get("detail", ""),
    )


def matrix_row(result: CellResult) -> Row:
    """A cell of the VFIO matrix (vm/experiment.py) as a row of the same table: its quirk mask in the kernel
    column. The matrix runs the workload with PyTorch's default backend (conv2d.py's --cudnn on, no benchmark)."""
    return Row(
        result.cell.id,
        f"quirks 0x{result.cell.mask:x}",
        result.cell.profile.name,
        cell_outcomes.DEFAULT_BACKEND,
        result.outcome,
        "-",
        result.max_error,
        result.seconds,
        result.detail,
    )


def table(rows: list[Row]) -> list[str]:
    lines = [f"{'cell':34} {'kernel':14} {'result':24} {'stopped at':38} {'max error':>9} {'time':>8}"]
    for r in rows:
        error = f"{r.max_error:.2e}" if r.max_error is not None else "-"
        seconds = f"{r.seconds:.1f} s" if r.seconds is not None else "-"
        lines.append(f"{r.cell:34} {r.kernel:14} {r.outcome:24} {r.stopped_at[:38]:38} {error:>9} {seconds:>8}")
    counts = {o: sum(r.outcome == o for r in rows) for o in cell_outcomes.NAMES}
    lines.append("counts: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n))
    return lines


def recommend(results: list[HostResult]) -> HostResult | None:
    order = list(profile_data.load())
    backends = list(cell_outcomes.BACKENDS)
    passing = [r for r in results if r.outcome == "pass" and not r.cell.profile.experiment_only]
    if not passing:
        return None
    return min(
        passing,
        key=lambda r: (
            r.cell.changes,
            order.index(r.cell.profile.name) if r.cell.profile.name in order else len(order),
            backends.index(r.cell.backend.name),
        ),
    )


def recommendation(best: HostResult | None, results: list[HostResult], stop: str | None = None) -> list[str]:
    """The answer; `stop`: why the experiment stopped before a setting could be tried (dead_end)."""
    if stop:
        return [stop]
    controls = sorted({r.cell.id for r in results if r.outcome == "pass" and r.cell.profile.experiment_only})
    tail = [f"(controls that passed, never recommended: {', '.join(controls)})"] if controls else []
    if best is None:
        return [
            "no user-space cell passed: no profile or backend setting made Conv2d right with this PyTorch and "
            "this kernel. Next: the kernel axis (quirk masks, amdgpu parameters), one boot per cell on this "
            "desktop: `sudo rdna1-kmgr experiment kernel` (or `vm-test matrix auto` on a host with a "
            "second GPU)"
        ] + tail
    cell = best.cell
    if cell.changes == 0:
        return [f"nothing to change: {cell.id} passes, your system as it is with PyTorch's defaults"] + tail
    lines = [f"smallest change that passes: {cell.id}"]
    if not cell.profile.changes_nothing:
        lines.append(
            f"  sudo rdna1-kmgr experiment apply      # installs profile {cell.profile.name}, journaled "
            f"(= profile install {cell.profile.name})"
        )
    if cell.backend.code:
        lines.append(f"  in your program, after `import torch`: {cell.backend.code}")
    return lines + tail


def html_page(rows: list[Row], title: str, lines: list[str]) -> str:
    """The grid: a row per profile, a column per kernel and backend, each square coloured by outcome."""
    columns = list(dict.fromkeys((r.kernel, r.backend) for r in rows))
    profiles = list(dict.fromkeys(r.profile for r in rows))
    at = {(r.profile, r.kernel, r.backend): r for r in rows}
    esc = html.escape
    head = "".join(f"<th>{esc(k)}<br>{esc(b)}</th>" for k, b in columns)
    body = []
    for profile in profiles:
        squares = []
        for kernel, backend in columns:
            r = at.get((profile, kernel, backend))
            if r is None:
                squares.append("<td></td>")
                continue
            colour = cell_outcomes.BY_NAME.get(r.outcome, cell_outcomes.BY_NAME["crash"]).colour
            squares.append(
                f'<td style="background:{colour}" title="{esc(r.detail)}"><b>{esc(r.outcome)}</b>'
                f"<br><small>{esc(r.stopped_at)}</small></td>"
            )
        body.append(f"<tr><th>{esc(profile)}</th>{''.join(squares)}</tr>")
    legend = "".join(
        f'<li><span style="background:{o.colour}">&nbsp;&nbsp;&nbsp;</span> <b>{o.name}</b>: ' f"{esc(o.meaning)}</li>"
        for o in cell_outcomes.OUTCOMES
    )
    text = esc("\n".join(lines))
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>' + esc(title) + "</title><style>"
        "table{border-collapse:collapse}td,th{border:1px solid #888;padding:4px 8px;text-align:center}"
        "</style></head><body><h1>"
        + esc(title)
        + "</h1><table><tr><th>profile</th>"
        + head
        + "</tr>"
        + "".join(body)
        + "</table><pre>"
        + text
        + "</pre><ul>"
        + legend
        + "</ul></body></html>\n"
    )


def new_run_dir() -> Path:
    """experiments/host-<time>/, created (a HostError in one line when the state folder is not writable)."""
    folder = experiments_dir() / f"host-{time.strftime('%Y%m%dT%H%M%S')}"
    try:
        make_dirs(folder)
        (folder / "cells").mkdir(exist_ok=True)
    except OSError as err:
        raise HostError(
            f"cannot write the experiment's results under {folder}: {err.strerror}",
            "run as root (sudo), or point RDNA1_KMGR_STATE at a folder you may write",
        ) from None
    return folder


def write(folder: Path, results: list[HostResult], best: HostResult | None, context: HostContext) -> HostRecord:
    """record.json and table.html in the run's folder, and experiments/host-latest.json (each atomically)."""
    rows = [host_row(r) for r in results]
    said = recommendation(best, results, context.dead_end)
    record = HostRecord(
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        context=context,
        cells=tuple(results),
        recommended=best,
        answer=tuple(said),
        folder=str(folder),
        html=str(folder / "table.html"),
    )
    page = html_page(rows, f"rdna1-kmgr experiment {record.time}", table(rows) + [""] + said)
    write_atomic(folder / "table.html", page.encode())
    document = record.to_json()
    write_json(folder / "record.json", document, indent=1)
    write_json(experiments_dir() / LATEST, document, indent=1)
    return record


def write_matrix_page(record: Path, rows: list[Row], lines: list[str]) -> Path:
    """The VFIO matrix's grid beside its JSON record (experiments/<time>.html), as the host experiment's."""
    page = record.with_suffix(".html")
    write_atomic(page, html_page(rows, f"rdna1-kmgr experiment, VFIO matrix {record.stem}", lines).encode())
    return page


def read_latest() -> dict | None:
    try:
        return json.loads((experiments_dir() / LATEST).read_text())
    except (OSError, ValueError):
        return None


# --- the kernel axis: one boot per kernel cell (experiment/kernel_run.py) ------------------------------------


def kernel_rows(plan, events: list[dict]) -> list[Row]:
    """A row per host cell run in each kernel cell's boot; a boot that never came back is a hang of each."""
    finished = {e["cell"]: e for e in events if e.get("event") in ("ran", "hang")}
    rows = []
    for kernel_cell in plan.kernel_cells:
        event = finished.get(kernel_cell.name)
        if event is None:
            continue
        if event["event"] == "hang":
            for host_id in plan.host_cells:
                profile, backend = host_id.split("/", 1)
                rows.append(
                    Row(
                        host_id,
                        kernel_cell.name,
                        profile,
                        backend,
                        "hang",
                        "boot",
                        None,
                        None,
                        f"the boot with {kernel_cell.parameter} never came back to run the cell (a hang, "
                        "or the machine was power-cycled)",
                    )
                )
            continue
        for r in event.get("results", []):
            where = f"{r['stage']}: {r['case']}" if r.get("stage") and r.get("case") else (r.get("stage") or "-")
            rows.append(
                Row(
                    r["cell"],
                    kernel_cell.name,
                    r["profile"],
                    r["backend"],
                    r["outcome"],
                    where,
                    r.get("max_error"),
                    r.get("seconds"),
                    r.get("detail", ""),
                )
            )
    return rows


def best_kernel_row(plan, rows: list[Row]) -> Row | None:
    """The smallest change that passes: a kernel cell's word plus the fewest user-space changes, then the
    plan's order of kernel cells (least change first), then of host cells. Rows of experiment controls (no-svm,
    override-1030, ...) are never the answer: they are there to compare."""
    from rdna1_kmgr.experiment import host_cells  # the cells' changes: profile, backend

    changes = {c.id: c.changes for c in host_cells.select()}
    controls = {name for name, p in profile_data.load().items() if p.experiment_only}
    order = [c.name for c in plan.kernel_cells]
    passing = [r for r in rows if r.outcome == "pass" and r.profile not in controls]
    if not passing:
        return None
    return min(
        passing,
        key=lambda r: (
            changes.get(r.cell, 2),
            order.index(r.kernel),
            plan.host_cells.index(r.cell) if r.cell in plan.host_cells else 0,
        ),
    )


def kernel_recommendation(plan, rows: list[Row], why: str) -> list[str]:
    from rdna1_kmgr.experiment import host_cells

    order = [c.name for c in plan.kernel_cells]
    ran = {r.kernel for r in rows}
    lines = [f"not run: {', '.join(n for n in order if n not in ran)} ({why})"] if why and ran != set(order) else []
    best = best_kernel_row(plan, rows)
    if best is None:
        return lines + [
            "no kernel cell made a host cell pass: neither these amdgpu parameters nor these quirk "
            "masks are the answer on this board. Keep the stock boot; `rdna1-kmgr doctor` lists what "
            "else is wrong"
        ]
    cell = next(c for c in plan.kernel_cells if c.name == best.kernel)
    lines.append(f"smallest change that passes: kernel cell {cell.name} ({cell.parameter}) with {best.cell}")
    how = (
        "install --quirks: the installed build with that mask, journaled"
        if cell.parameter.startswith(KERNEL_PREFIX)
        else "on every boot's command line through GRUB, journaled"
    )
    lines.append(f"  sudo rdna1-kmgr experiment apply --kernel-cell {cell.name}   # {how}")
    host = next((c for c in host_cells.select() if c.id == best.cell), None)
    if host is not None and not host.profile.changes_nothing:
        lines.append(f"  sudo rdna1-kmgr profile install {host.profile.name}")
    if host is not None and host.backend.code:
        lines.append(f"  in your program, after `import torch`: {host.backend.code}")
    return lines


def write_kernel_record(plan, events: list[dict], why: str) -> dict:
    """record.json and table.html in the run's folder: the kernel cells' table and the answer."""
    folder = Path(plan.folder)
    rows = kernel_rows(plan, events)
    lines = table(rows)
    said = kernel_recommendation(plan, rows, why)
    best = best_kernel_row(plan, rows)
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "kind": "kernel",
        "plan": plan.to_json(),
        "recommended_kernel_cell": best.kernel if best else None,
        "rows": [r.__dict__ for r in rows],
        "events": events,
        "stopped": why or None,
        "counts": {o: sum(r.outcome == o for r in rows) for o in cell_outcomes.NAMES},
        "table": lines,
        "answer": said,
        "folder": str(folder),
        "html": str(folder / "table.html"),
    }
    make_dirs(folder)
    write_atomic(
        folder / "table.html",
        html_page(rows, f"rdna1-kmgr experiment, kernel cells {record['time']}", lines + [""] + said).encode(),
    )
    write_json(folder / "record.json", record, indent=1)
    return record


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
