"""Kernel-cells plans as `experiment kernel` records them, for tests that read a finished run.

A helper module, not a test module: test_kernel_cells and test_answer import from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rdna1_kmgr.experiment import kernel_run


def kernel_plan(folder: Path, cells, host_cells: tuple[str, ...]) -> kernel_run.Plan:
    """A kernel-cells plan as `experiment kernel` records it, run as root, for tests that read a finished run."""
    return kernel_run.Plan(
        str(folder),
        tuple(cells),
        host_cells,
        sys.executable,
        "/",
        {},
        kernel_run.cell_run.Limits(),
        True,
        False,
        {"name": "root", "uid": 0, "gid": 0},
    )
