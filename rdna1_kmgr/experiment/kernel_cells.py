"""The experiment's kernel cells: one word on the kernel command line each, for one boot.

Two kinds. Stock amdgpu parameters, as data (kernel_cells.toml). And rdna1_quirks masks: with a patched build
installed for the running kernel, one cell per opt-in bit the build carries (its default mask plus that bit),
and one with every bit off when the default has some (does the default matter on this board).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.render.quirk_mask import QuirkMask

_PARAMETER = user_input.AMDGPU_PARAMETER  # one word: amdgpu's own syntax, nothing GRUB or a shell reads as code
_NAME = re.compile(r"[a-z0-9][a-z0-9+-]{0,40}")


@dataclass(frozen=True)
class KernelCell:
    name: str
    parameter: str  # the one word the cell's boot adds to the kernel command line
    summary: str
    evidence: str = ""

    def __post_init__(self):
        if not _NAME.fullmatch(self.name) or not _PARAMETER.fullmatch(self.parameter):
            raise ValueError(f"kernel cell {self.name!r}: bad name or parameter {self.parameter!r}")

    def to_json(self) -> dict:
        return {"name": self.name, "parameter": self.parameter, "summary": self.summary, "evidence": self.evidence}

    @classmethod
    def from_json(cls, data: dict) -> KernelCell:
        return cls(data["name"], data["parameter"], data.get("summary", ""), data.get("evidence", ""))


@dataclass(frozen=True)
class InstalledBuild:
    """The bits of the patched build installed for the running kernel (from its render manifest)."""

    default_mask: QuirkMask
    carried_mask: QuirkMask


def stock_cells() -> list[KernelCell]:
    text = (resources.files("rdna1_kmgr.experiment") / "kernel_cells.toml").read_text()
    return [
        KernelCell(name, entry["parameter"], entry["summary"], entry.get("evidence", ""))
        for name, entry in tomllib.loads(text).items()
    ]


def quirk_cells(build: InstalledBuild | None) -> list[KernelCell]:
    if build is None:
        return []
    names = {1 << bit.bit: bit.id for quirk in quirk_catalog.load_quirks().values() for bit in quirk.bits}
    cells = []
    if build.default_mask.bits:
        cells.append(
            KernelCell(
                "quirks-off",
                "amdgpu.rdna1_quirks=0",
                "the installed build with every rdna1 quirk off (its stock behaviour)",
            )
        )
    for value in sorted(names):
        if build.carried_mask.bits & value and not build.default_mask.bits & value:
            mask = QuirkMask(build.default_mask.bits | value)
            cells.append(
                KernelCell(
                    f"quirks+{names[value]}",
                    mask.kernel_parameter,
                    f"the installed build's default quirks plus {names[value]} (opt-in)",
                )
            )
    return cells


def select(names: tuple[str, ...], build: InstalledBuild | None) -> list[KernelCell]:
    """Every cell (stock parameters, then the build's masks), or the named ones in that order; an unknown name
    is one UsageError naming what there is."""
    catalog = {c.name: c for c in stock_cells() + quirk_cells(build)}
    unknown = [n for n in names if n not in catalog]
    if unknown:
        hint = "the quirk-mask cells need a patched build installed for the running kernel (`rdna1-kmgr install`)"
        raise UsageError(
            f"unknown kernel cell {unknown[0]!r}", f"choose from: {', '.join(catalog)}" + ("" if build else f"; {hint}")
        )
    return [c for c in catalog.values() if c.name in names] if names else list(catalog.values())
