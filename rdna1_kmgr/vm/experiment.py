"""The experiment matrix: quirk mask x user-space profile, each cell run on the board, classified, tabled,
recorded, and the smallest passing cell recommended.

Masks come from the quirk catalog (kmod/quirks/*/quirk.toml): 0, each quirk's bit alone, all of them.
Profiles come from userspace/profiles.toml. A cell is judged from the guest's facts (qemu/guest/matrix.py)
with the outcomes the host experiment uses too (cell_outcomes.py):

    pass    every workload case within tolerance of the CPU
    wrong   the workload ran and some case is off (max error shown)
    crash   the module did not load, or the workload died (a signal) without a report
    hang    the cell's time limit ran out (in the guest, or the whole VM stopped answering)
    not-run the workload could not start (no torch with a GPU in the guest): no verdict on the board
    and a failure's own kind when its text names one (not-applicable, invalid-device-function,
    kernel-image-invalid, queue-failed, memory-fault)

`run` drives batches: one VM runs cells until one leaves the GPU suspect, then a fresh VM takes the rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.files import make_dirs, write_json
from rdna1_kmgr.core.paths import state_dir
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.userspace import profiles as profile_data
from rdna1_kmgr.vm import cell_outcomes
from rdna1_kmgr.vm.guest import say

OUTCOMES = cell_outcomes.NAMES


@dataclass(frozen=True)
class Cell:
    mask: int
    quirks: tuple[str, ...]  # the quirk ids of the mask's bits
    profile: profile_data.Profile

    @property
    def id(self) -> str:
        return f"0x{self.mask:x}/{self.profile.name}"

    def plan(self) -> dict:
        """What the guest needs to run this cell."""
        return {"id": self.id, "mask": self.mask, "set": dict(self.profile.set), "unset": list(self.profile.unset)}


@dataclass
class CellResult:
    cell: Cell
    outcome: str
    detail: str
    max_error: float | None = None
    seconds: float | None = None
    attempt: int = 1  # which VM of the run it ran in

    def to_json(self) -> dict:
        return {
            "cell": self.cell.id,
            "mask": self.cell.mask,
            "quirks": list(self.cell.quirks),
            "profile": self.cell.profile.name,
            "outcome": self.outcome,
            "detail": self.detail,
            "max_error": self.max_error,
            "seconds": self.seconds,
            "vm": self.attempt,
        }


def masks(catalog: dict[str, quirk_catalog.Quirk]) -> list[tuple[int, tuple[str, ...]]]:
    """0, each quirk alone, all quirks: (mask, quirk ids), without repeats (one quirk: all == alone)."""
    ordered = sorted(catalog.values(), key=lambda q: q.bit)
    found: list[tuple[int, tuple[str, ...]]] = [(0, ())] + [(1 << q.bit, (q.id,)) for q in ordered]
    every = (sum(1 << q.bit for q in ordered), tuple(q.id for q in ordered))
    if every not in found:
        found.append(every)
    return found


def cells(
    catalog: dict[str, quirk_catalog.Quirk] | None = None, profiles: dict[str, profile_data.Profile] | None = None
) -> list[Cell]:
    catalog = quirk_catalog.load_quirks() if catalog is None else catalog
    profiles = profile_data.load() if profiles is None else profiles
    return [Cell(mask, ids, profile) for mask, ids in masks(catalog) for profile in profiles.values()]


# --- judging one cell ------------------------------------------------------------------------------------------


def classify(cell: Cell, entry: dict | None, vm_ended: str | None, attempt: int = 1) -> CellResult:
    """One cell from the guest's entry for it. `vm_ended` says why the VM ended when the entry is not done
    ("timeout" or another reason); None when the guest finished the cell itself."""
    if entry is None or not entry.get("done"):
        if vm_ended == "timeout":
            return CellResult(cell, "hang", "the VM stopped answering during this cell and was killed", attempt=attempt)
        return CellResult(cell, "crash", f"the VM ended during this cell ({vm_ended or 'no result'})", attempt=attempt)
    load = entry.get("load")
    if load is not None and load.get("rc") != 0:
        return CellResult(
            cell, "crash", f"insmod rdna1_quirks=0x{cell.mask:x} failed: {_last(load.get('output'))}", attempt=attempt
        )
    runs = (entry.get("workload") or {}).get("runs") or []
    if not runs:
        return CellResult(cell, "not-run", "the workload did not run", attempt=attempt)
    last = runs[-1]
    seconds = last.get("seconds")
    report = last.get("report")
    if last.get("rc") is None and "timed out" in (last.get("output") or ""):
        return CellResult(cell, "hang", f"the workload {last['output']}", seconds=seconds, attempt=attempt)
    if isinstance(report, dict) and "error" in report:
        kind = "not-run" if last.get("rc") == 3 else cell_outcomes.from_text(report["error"]) or "crash"
        return CellResult(cell, kind, report["error"], seconds=seconds, attempt=attempt)
    if not isinstance(report, dict) or "cases" not in report:
        kind = cell_outcomes.from_text(last.get("output") or "") or "crash"
        return CellResult(
            cell,
            kind,
            f"the workload exited {last.get('rc')} without a report: " f"{_last(last.get('output'))}",
            seconds=seconds,
            attempt=attempt,
        )
    cases = report["cases"]
    worst = max((c.get("max_abs_err") or 0.0 for c in cases), default=0.0)
    bad = [c for c in cases if not c.get("ok")]
    failed = cell_outcomes.from_cases(cases)
    if failed is not None and failed[0] != "wrong":
        return CellResult(
            cell, failed[0], f"{failed[1]['case']}: {failed[1].get('error', '')}", worst, seconds, attempt
        )
    unload = entry.get("unload")
    if unload is not None and unload.get("rc") != 0:
        return CellResult(
            cell, "crash", f"rmmod failed after the workload: {_last(unload.get('output'))}", worst, seconds, attempt
        )
    if bad:
        return CellResult(
            cell, "wrong", f"{len(bad)} of {len(cases)} cases off, first: {bad[0]['case']}", worst, seconds, attempt
        )
    return CellResult(cell, "pass", f"{len(cases)} cases within tolerance", worst, seconds, attempt)


def _last(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# --- driving the batches ---------------------------------------------------------------------------------------


@dataclass
class Batch:
    """What one VM gave back: the guest's result.json (None if none) and why the VM ended."""

    result: dict | None
    ended: str | None  # None: the guest finished its plan; "timeout"; or what else ended it


BatchRunner = Callable[[list[Cell], int], Batch]  # (cells, attempt) -> Batch


def run(
    all_cells: list[Cell],
    run_batch: BatchRunner,
    max_vms: int | None = None,
) -> list[CellResult]:
    """Every cell, through as many VMs as it takes: a VM ends after a cell that left the GPU suspect (or
    was killed), and the cells it did not reach go to a fresh one. A VM that ran no cell at all ends the
    experiment: the same would happen again."""
    results: dict[str, CellResult] = {}
    pending = list(all_cells)
    attempt = 0
    while pending and (max_vms is None or attempt < max_vms):
        attempt += 1
        say(f"VM {attempt}: {len(pending)} cell(s) to run")
        batch = run_batch(pending, attempt)
        entries = {e["id"]: e for e in ((batch.result or {}).get("cells") or [])}
        for cell in pending:
            entry = entries.get(cell.id)
            if entry is None:
                continue
            result = classify(cell, entry, None if entry.get("done") else batch.ended or "no result", attempt)
            results[cell.id] = result
            say(f"  {cell.id:32} {result.outcome:7} {result.detail}")
        if not entries:
            for cell in pending:
                results[cell.id] = CellResult(
                    cell, "not-run", f"VM {attempt} ran no cell: {batch.ended or 'no result'}", attempt=attempt
                )
            break
        pending = [c for c in pending if c.id not in results]
    for cell in pending:
        results.setdefault(cell.id, CellResult(cell, "not-run", "not reached", attempt=attempt))
    return [results[c.id] for c in all_cells]


# --- the answer ------------------------------------------------------------------------------------------------


def recommend(results: list[CellResult], profile_order: list[str] | None = None) -> CellResult | None:
    """The smallest passing cell: fewest quirks, then the lowest mask, then the profile that changes least
    (the file's order puts "as installed" first). Experiment controls (experiment_only profiles) never are."""
    order = profile_order or list(profile_data.load())
    passing = [r for r in results if r.outcome == "pass" and not r.cell.profile.experiment_only]
    if not passing:
        return None
    return min(
        passing,
        key=lambda r: (
            bin(r.cell.mask).count("1"),
            r.cell.mask,
            order.index(r.cell.profile.name) if r.cell.profile.name in order else len(order),
        ),
    )


def recommendation_lines(best: CellResult | None) -> list[str]:
    if best is None:
        return ["no cell passed: neither the quirks nor a user-space profile made Conv2d right on this board"]
    lines = [
        f"smallest passing cell: rdna1_quirks=0x{best.cell.mask:x} "
        f"({' '.join(best.cell.quirks) or 'no quirk'}) with profile {best.cell.profile.name}",
        f"  sudo rdna1-kmgr install --quirks 0x{best.cell.mask:x}",
    ]
    if not best.cell.profile.changes_nothing:
        lines.append(f"  sudo rdna1-kmgr profile install {best.cell.profile.name}")
    return lines


def experiments_dir() -> Path:
    return state_dir() / "experiments"


def write_record(results: list[CellResult], best: CellResult | None, context: dict) -> Path:
    """The experiment as a JSON record: experiments/<time>.json, and latest.json beside it."""
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **context,
        "cells": [r.to_json() for r in results],
        "counts": {o: sum(r.outcome == o for r in results) for o in OUTCOMES},
        "recommended": best.to_json() if best else None,
        "commands": recommendation_lines(best)[1:] if best else [],
    }
    folder = experiments_dir()
    make_dirs(folder)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%S')}.json"
    for target in (path, folder / "latest.json"):
        write_json(target, record, indent=1)
    return path


def read_latest() -> dict | None:
    try:
        return json.loads((experiments_dir() / "latest.json").read_text())
    except (OSError, ValueError):
        return None
