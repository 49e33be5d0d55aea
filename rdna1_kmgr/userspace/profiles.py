"""The user-space profiles of profiles.toml: what each one sets and unsets in ROCm's environment."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources

from rdna1_kmgr.core.errors import UsageError

# MIOpen's convolution solver families, each switched by MIOPEN_DEBUG_CONV_<FAMILY>.
SOLVER_FAMILIES = ("GEMM", "IMPLICIT_GEMM", "DIRECT", "WINOGRAD", "FFT")
SOLVER_PREFIX = "MIOPEN_DEBUG_CONV_"
OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"
# Variables a profile may touch: what the experiment varies, nothing that could reach a shell unquoted.
_NAME = re.compile(r"^(HSA|HIP|ROC|ROCR|MIOPEN|PYTORCH|AMD)_[A-Z0-9_]+$")
_VALUE = re.compile(r"^[A-Za-z0-9._,:+-]*$")


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    set: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    @property
    def changes_nothing(self) -> bool:
        return not self.set and not self.unset

    def apply(self, environ: dict[str, str]) -> dict[str, str]:
        """`environ` as this profile makes it (a new dict)."""
        result = {k: v for k, v in environ.items() if k not in self.unset}
        result.update(self.set)
        return result

    def to_json(self) -> dict:
        return {"name": self.name, "summary": self.summary, "set": dict(self.set), "unset": list(self.unset)}


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
        values.update({SOLVER_PREFIX + family: "1" if family == solver else "0" for family in SOLVER_FAMILIES})
    for key, value in values.items():
        if not _NAME.match(key) or not _VALUE.match(value):
            raise ValueError(f"profiles.toml: {name}: {key}={value!r} is not a ROCm variable and a plain value")
    unset = tuple(table.get("unset", ()))
    return Profile(name, table["summary"], values, unset)


def get(name: str) -> Profile:
    catalog = load()
    if name not in catalog:
        raise UsageError(f"unknown profile {name!r}", f"choose one of: {', '.join(catalog)}")
    return catalog[name]
