"""A second ROCm pulled into PyTorch's own: LD_LIBRARY_PATH, ROCM_PATH, HIP_PATH or ROCM_HOME pointing at an
AMD /opt/rocm* tree while the PyTorch in use brings its ROCm (TheRock's rocm-sdk wheels, or torch/lib).

The dynamic loader searches LD_LIBRARY_PATH before a library's RUNPATH (ld.so(8)), so an /opt/rocm*/lib
there gives a wheel's HIP and its libraries another ROCm's copies: the owner's notes this project started
from ran ROCm 5.2's libraries under a ROCm 5.7 wheel that way. The loader does not read ROCM_PATH, HIP_PATH or
ROCM_HOME; tools and build systems (hipcc, runtime compilation, PyTorch's C++ extensions) take their ROCm
from them. Read wherever an environment can be set, as the override is (userspace/environment_files.py).
"""

from __future__ import annotations

import re

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.userspace import environment_files

LOADER = "LD_LIBRARY_PATH"
ROOTS = ("ROCM_PATH", "HIP_PATH", "ROCM_HOME")
NAMES = (LOADER, *ROOTS)
_OPT_ROCM = re.compile(r"(?:^|:)(/opt/rocm[^:/]*)(/[^:]*)?")


def wanted(name: str) -> bool:
    return name in NAMES


def opt_rocm_in(value: str | None) -> list[str]:
    """The /opt/rocm* entries of a path list: "/opt/rocm-5.2.0/lib:/usr/lib" -> ["/opt/rocm-5.2.0/lib"]."""
    return [m.group(1) + (m.group(2) or "") for m in _OPT_ROCM.finditer(value or "")]


def findings(found: list[environment_files.Assignment], own_rocm: list[str], checked: str) -> list[Finding]:
    """`own_rocm`: where the PyTorch builds found keep their ROCm (empty: none brings its own)."""
    pointing = [(a, opt_rocm_in(a.value)) for a in found if a.value is not None and opt_rocm_in(a.value)]
    facts = {"assignments": [a.to_json() for a, _ in pointing], "pytorch_rocm": own_rocm}
    if not pointing:
        return [
            Finding("mixed-stacks", "ok", f"no {', '.join(NAMES)} pointing at /opt/rocm* ({checked})", "", "", facts)
        ]
    result = []
    for assignment, trees in pointing:
        seen = f"{assignment.name}={assignment.value} in {assignment.where()}"
        remove = f"remove {', '.join(trees)} from {assignment.name} in {assignment.where()}"
        if not own_rocm:
            result.append(
                Finding(
                    "mixed-stacks",
                    "info",
                    seen,
                    "no PyTorch with its own ROCm was found: " "programs use this ROCm as set",
                    "",
                    assignment.to_json(),
                )
            )
        elif assignment.name == LOADER:
            result.append(
                Finding(
                    "mixed-stacks",
                    "problem",
                    f"{seen}, while PyTorch brings its own ROCm " f"({', '.join(own_rocm)})",
                    "the loader searches LD_LIBRARY_PATH before the wheel's RUNPATH: PyTorch then "
                    "runs with this tree's HIP runtime or libraries instead of its own (mixed "
                    "versions crash or compute wrong)",
                    f"{remove} (set it only for programs that use that ROCm)",
                    assignment.to_json(),
                )
            )
        else:
            result.append(
                Finding(
                    "mixed-stacks",
                    "warn",
                    f"{seen}, while PyTorch brings its own ROCm " f"({', '.join(own_rocm)})",
                    "the loader does not read it, but hipcc, runtime compilation and PyTorch's C++ "
                    "extension builds take their ROCm from it: they then use another ROCm than "
                    "the one PyTorch runs",
                    f"{remove}, or point it at PyTorch's ROCm (`rocm-sdk path --root`)",
                    assignment.to_json(),
                )
            )
    return result
