"""The host experiment's cells: user-space profile x backend setting, each run in a fresh process of the
owner's PyTorch with its own MIOpen caches."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.userspace import profiles as profile_data
from rdna1_kmgr.vm import cell_outcomes


@dataclass(frozen=True)
class HostCell:
    profile: profile_data.Profile
    backend: cell_outcomes.Backend

    @property
    def id(self) -> str:
        return f"{self.profile.name}/{self.backend.name}"

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """The owner's environment as the profile makes it."""
        return self.profile.apply(base)

    @property
    def changes(self) -> int:
        """How much the owner changes to get this cell: a profile, a line of code, both, neither."""
        return int(not self.profile.changes_nothing) + int(self.backend.name != cell_outcomes.DEFAULT_BACKEND)


def select(
    profile_names: list[str] | tuple[str, ...] = (),
    backend_names: list[str] | tuple[str, ...] = (),
    pattern: str | None = None,
) -> list[HostCell]:
    """Every profile (the file's order) by every backend, narrowed by names and a glob on the cell id
    (`no-override/*`, `*/no-miopen`). An unknown name or a pattern that matches nothing is a UsageError."""
    catalog = profile_data.load()
    chosen = [profile_data.get(name) for name in profile_names] if profile_names else list(catalog.values())
    for name in backend_names:
        if name not in cell_outcomes.BACKENDS:
            raise UsageError(f"unknown backend {name!r}", f"choose one of: {', '.join(cell_outcomes.BACKENDS)}")
    backends = [cell_outcomes.BACKENDS[n] for n in backend_names] or list(cell_outcomes.BACKENDS.values())
    cells = [HostCell(p, b) for p in chosen for b in backends]
    if pattern:
        cells = [c for c in cells if fnmatch.fnmatchcase(c.id, pattern)]
        if not cells:
            raise UsageError(
                f"--cells {pattern!r} matches no cell",
                "cells are PROFILE/BACKEND, e.g. 'no-override/*' or '*/no-miopen' "
                "(`rdna1-kmgr profile list` names the profiles)",
            )
    return cells
