"""HSA_OVERRIDE_GFX_VERSION wherever it is set, and the processor it makes ROCm load code for.

ROCm's runtime reports the GPU as the processor the variable names (10.3.0: gfx1030, RDNA2) instead of
the one KFD reports, and every library then loads that processor's code. On a gfx1010 board that runs
RDNA2 code on RDNA1 hardware: owners report crashes with it, and working PyTorch without it on a stack
built for gfx1010 (ROCm/legacy-rocm-build#887; sdnext stopped setting it by default).
"""

from __future__ import annotations

import re

from rdna1_kmgr.doctor import code_objects
from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.userspace import environment_files
from rdna1_kmgr.userspace.profiles import OVERRIDE

_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)\.([0-9]+)$")


def processor_of(value: str) -> str | None:
    """gfx1030 for "10.3.0"; None for a value ROCm would not accept."""
    match = _VERSION.fullmatch(value.strip())
    return code_objects.gfx_name(*(int(g) for g in match.groups())) if match else None


def effective(found: list[environment_files.Assignment]) -> environment_files.Assignment | None:
    """The assignment in force: the process's own when it has one, else the last line read that sets or
    unsets it (files are read in login order)."""
    process = [a for a in found if a.scope == "process"]
    if process:
        return process[-1]
    last = found[-1] if found else None
    return last if last is not None and last.value is not None else None


def remedy(assignment: environment_files.Assignment, board: str) -> str:
    """What to do about one assignment: edit that file's line. No profile can undo it: an `export` in
    ~/.bashrc runs after /etc/profile.d in a login shell, and environment.d reaches only systemd user units."""
    if assignment.scope == "process":
        edit = "`unset` it in that shell, then remove the line that set it (doctor lists the files it read)"
    elif assignment.path.name == "state" and assignment.path.parent.name == "conda-meta":
        edit = f"run `conda env config vars unset {OVERRIDE} -p {assignment.path.parent.parent}` (it is set there)"
    else:
        edit = (
            f"edit {assignment.path} and delete (or comment out) line {assignment.line}; a profile cannot "
            "undo it (a shell file's `export` runs after /etc/profile.d, environment.d reaches only systemd "
            "user units)"
        )
    return f"{edit}; then use libraries with {board} code (see rocblas, torch, rocm-sdk)"


def findings(found: list[environment_files.Assignment], board: str, checked: str) -> tuple[list[Finding], str]:
    """Findings for every place the override is set, and the processor ROCm loads code for (`board` when
    nothing overrides it). `checked` says which files and environments were read."""
    sets = [a for a in found if a.value is not None]
    if not sets:
        return [
            Finding(
                "gfx-override",
                "ok",
                f"{OVERRIDE} is not set ({checked})",
                f"ROCm loads the board's own {board} code",
                "",
                {"assignments": [a.to_json() for a in found]},
            )
        ], board
    in_force = effective(found)
    # effective gives a line that sets it (or the process's own value, always a string), never an unset
    loads = processor_of(in_force.value) if in_force is not None and in_force.value is not None else None
    result = []
    for assignment in sets:
        assert assignment.value is not None, "sets holds only the lines that set it"
        target = processor_of(assignment.value)
        what = f"ROCm loads {target} code instead of {board}" if target else "ROCm refuses a malformed value"
        active = assignment is in_force
        result.append(
            Finding(
                "gfx-override",
                "problem" if target != board else "info",
                f"{OVERRIDE}={assignment.value} in {assignment.where()}" + (" (in force)" if active else ""),
                f"{what}: code built for another processor on RDNA1 hardware; owners report crashes with the "
                f"common 10.3.0 advice and working PyTorch without it on libraries built for {board}",
                remedy(assignment, board),
                assignment.to_json(),
            )
        )
    return result, loads or board
