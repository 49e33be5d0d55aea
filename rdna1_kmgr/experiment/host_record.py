"""The host experiment's record: what `rdna1-kmgr experiment --json` prints and what record.json and
experiments/host-latest.json hold (answer.write writes them). `experiment apply`, the kernel cells' first choice
and `report` read those files back by their keys, so to_json keeps every key, and the order they are written in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rdna1_kmgr.core import output
from rdna1_kmgr.experiment.cell_run import HostResult, Limits
from rdna1_kmgr.vm import cell_outcomes

KIND = "host"  # the kernel cells' record says "kernel" (answer.write_kernel_record)


@dataclass(frozen=True)
class HostContext:
    """What the run knew beside its cells: the board, the owner's PyTorch, the limits and the cells planned, and
    why it stopped early. Every record has each key: stopped and dead_end are null when the run did not stop."""

    board: str  # the board's PCI address
    python: str  # the owner's python that ran the cells
    owner: str  # the user the cells ran as
    torch: str
    hip: str | None
    kernel_log_readable: bool  # False: ring timeouts and GPU resets per cell are not seen (not root)
    limits: Limits
    sweep: str  # the workload's sweep: "experiment", or "experiment-quick" (--quick)
    planned: tuple[str, ...]  # the cells selected, in order; a stop leaves the rest unrun
    stopped: str | None  # a GPU reset failed: what to do
    dead_end: str | None  # a cell could not run, or KFD refused the board's queues: why


@dataclass(frozen=True)
class HostRecord:
    time: str  # when the record was written, "%Y-%m-%dT%H:%M:%S%z"
    context: HostContext
    cells: tuple[HostResult, ...]  # the cells that ran, in order
    recommended: HostResult | None  # the smallest change that passes (answer.recommend)
    answer: tuple[str, ...]  # the answer, said in lines
    folder: str  # the run's folder: record.json, table.html, a folder per cell
    html: str  # the table page in it

    @property
    def counts(self) -> dict[str, int]:
        """Cells per outcome, every outcome named (0 for one no cell had)."""
        return {o: sum(c.outcome == o for c in self.cells) for o in cell_outcomes.NAMES}

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "kind": KIND,
            **output.to_json(self.context),
            "cells": [c.to_json() for c in self.cells],
            "counts": self.counts,
            "recommended": self.recommended.to_json() if self.recommended else None,
            "answer": list(self.answer),
            "folder": self.folder,
            "html": self.html,
        }
