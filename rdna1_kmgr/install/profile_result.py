"""What `rdna1-kmgr profile list|install|remove` shows, did, or would do: the results the command renders and
`--json` serialises (core/output.py), with the keys `profile --json` has always had."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rdna1_kmgr.core.output import optional
from rdna1_kmgr.userspace.profiles import Profile


@dataclass(frozen=True)
class ProfileInstalled:
    """A profile's install: its plan (`--dry-run`), or the plan and what was done (`done`: None in a plan)."""

    profile: Profile
    dry_run: bool
    plan: tuple[str, ...]
    done: tuple[str, ...] | None = optional()

    def lines(self) -> tuple[str, ...]:
        """The plan (dry run) or what the install did."""
        return self.plan if self.done is None else self.done


@dataclass(frozen=True)
class ProfileRemoved:
    """The installed profile's removal: none installed (`message`), its plan (`--dry-run`), or the plan and what
    was done."""

    installed: bool
    dry_run: bool
    message: str | None = optional()  # only when none is installed
    plan: tuple[str, ...] | None = optional()
    done: tuple[str, ...] | None = optional()

    def lines(self) -> tuple[str, ...]:
        """The message (none installed), the plan (dry run) or what the removal did."""
        if not self.installed:
            return (self.message or "",)
        if self.done is None:
            return self.plan or ()
        return self.done


@dataclass(frozen=True)
class ProfileCatalog:
    """`profile list`: every profile, in profiles.toml's order. Its --json is one key per profile, the profile's
    name (as it was before the result was typed)."""

    profiles: tuple[Profile, ...]

    def to_json(self) -> dict[str, Any]:
        return {p.name: p.to_json() for p in self.profiles}

    def lines(self) -> list[str]:
        """Each profile's name and summary; under it, what it unsets and sets, and why an experiment control is
        not installed."""
        lines = []
        for p in self.profiles:
            lines.append(f"{p.name:20} {p.summary}")
            changes = " ".join([f"unset {u}" for u in p.unset] + [f"{k}={v}" for k, v in p.set.items()])
            if changes:
                lines.append(f"{'':20} {changes}")
            if p.experiment_only:
                lines.append(f"{'':20} experiment only (not installed): {p.experiment_only}")
        return lines
