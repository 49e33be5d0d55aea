"""What two vm-test modes give back that is no verdict record: the devices `vm-test restore` gave back, and the
board experiment's report (`vm-test matrix`). Their fields are the keys of the modes' --json, which scripts read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.vm.experiment import CellResult
from rdna1_kmgr.vm.vfio import Returned


@dataclass(frozen=True)
class RestoreResult:
    """`vm-test restore`: every device a killed run left on vfio-pci, given back or left and why (empty: none)."""

    restored: tuple[Returned, ...]

    @property
    def failed(self) -> tuple[Returned, ...]:
        """The devices not given back."""
        return tuple(r for r in self.restored if not r.ok)


@dataclass(frozen=True)
class MatrixResult:
    """`vm-test matrix`: the experiment's record, its grid page beside it, every cell's result and the pick (None:
    no cell passed)."""

    record: Path  # experiments/<time>.json
    html: Path  # experiments/<time>.html
    cells: tuple[CellResult, ...]
    recommended: CellResult | None
