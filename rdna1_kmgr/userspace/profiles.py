"""The user-space profiles of profiles.toml: what each one sets and unsets in ROCm's environment, and which
are experiment controls that `profile install` refuses."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources

from rdna1_kmgr.core.errors import UsageError

# MIOpen's convolution solver families, each switched off by MIOPEN_DEBUG_CONV_<FAMILY>=0 (1 does nothing).
SOLVER_FAMILIES = ("GEMM", "IMPLICIT_GEMM", "DIRECT", "WINOGRAD", "FFT")
# Never switched off by a profile: it holds MIOpen's naive solvers, the fallback (src/solver.cpp).
FALLBACK_FAMILY = "DIRECT"
SOLVER_PREFIX = "MIOPEN_DEBUG_CONV_"
OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"
# Variables a profile may touch: what the experiment varies, nothing that could reach a shell unquoted. AMDGCN_:
# Triton's AMD backend (AMDGCN_USE_BUFFER_OPS, the triton stage's profile); its other AMDGCN_ variables only dump.
_NAME = re.compile(r"^(HSA|HIP|ROC|ROCR|MIOPEN|PYTORCH|AMD|AMDGCN)_[A-Z0-9_]+$")
_VALUE = re.compile(r"^[A-Za-z0-9._,:+-]*$")


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    set: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    experiment_only: str = ""  # why `profile install` refuses it (a control of the experiment); "" installable

    @property
    def changes_nothing(self) -> bool:
        return not self.set and not self.unset

    def apply(self, environ: dict[str, str]) -> dict[str, str]:
        """`environ` as this profile makes it (a new dict)."""
        result = {k: v for k, v in environ.items() if k not in self.unset}
        result.update(self.set)
        return result

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "summary": self.summary,
            "set": dict(self.set),
            "unset": list(self.unset),
            "experiment_only": self.experiment_only or None,
        }


def load() -> dict[str, Profile]:
    """Every profile, in the file's order."""
    raw = tomllib.loads(resources.files("rdna1_kmgr.userspace").joinpath("profiles.toml").read_text())
    return {name: _profile(name, table) for name, table in raw.items()}


def _profile(name: str, table: dict) -> Profile:
    values = {str(k): str(v) for k, v in table.get("set", {}).items()}
    solver = table.get("solver")
    if solver is not None:
        if solver not in SOLVER_FAMILIES:
            raise ValueError(f"profiles.toml: {name}: unknown solver family {solver!r}")
        values.update(
            {SOLVER_PREFIX + family: "0" for family in SOLVER_FAMILIES if family not in (solver, FALLBACK_FAMILY)}
        )
    for key, value in values.items():
        if not _NAME.fullmatch(key) or not _VALUE.fullmatch(value):
            raise ValueError(f"profiles.toml: {name}: {key}={value!r} is not a ROCm variable and a plain value")
    unset = tuple(table.get("unset", ()))
    return Profile(name, table["summary"], values, unset, str(table.get("experiment_only", "")))


def get(name: str) -> Profile:
    catalog = load()
    if name not in catalog:
        raise UsageError(f"unknown profile {name!r}", f"choose one of: {', '.join(catalog)}")
    return catalog[name]


def installable(name: str) -> Profile:
    """The profile `profile install` may write; an experiment control is refused with its reason."""
    profile = get(name)
    if profile.experiment_only:
        others = ", ".join(n for n, p in load().items() if not p.experiment_only and not p.changes_nothing)
        raise UsageError(
            f"profile {name!r} is an experiment control and is not installed: " f"{profile.experiment_only}",
            f"install one of: {others}",
        )
    return profile
