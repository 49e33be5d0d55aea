"""MIOpen's environment as set on this system, read as MIOpen reads it, for a gfx1010 board.

Read in MIOpen (ROCm/MIOpen, the 2024 tree; newer MIOpen lives in ROCm/rocm-libraries and was not read):

- a boolean variable is false for 0, no, off, false, disable(d) and true for 1, yes, on, true, enable(d);
  anything else is an error (src/include/miopen/env.hpp). `MIOPEN_DEBUG_CONV_<FAMILY>` switches a
  family off only when false (`env::disabled`, src/conv/solver_finders.cpp): `=1` enables nothing
  that was not on already, so "one family alone" needs the others at 0;
- the naive solvers, MIOpen's last resort, are registered in the direct family (src/solver.cpp,
  ConvDirectNaiveConv*), so `MIOPEN_DEBUG_CONV_DIRECT=0` removes the fallback: problems no other solver
  takes then fail with "No suitable algorithm";
- the "deprecated" solvers run only on gfx803, gfx900, gfx906, gfx908, gfx90a and gfx103x unless
  MIOPEN_DEBUG_ENABLE_DEPRECATED_SOLVERS is true (`ThisSolverIsDeprecatedStatic`, src/solver.cpp). In
  rocm-libraries' MIOpen the old OpenCL direct solvers (ConvOclDirectFwd and its kin) are among them, so on a
  gfx1010 the setting brings those back. The implicit-GEMM solvers are deprecated too, but each also checks
  `IsComposableKernelSupportedHardware` (src/include/miopen/solver/static_ck_common.hpp:
  gfx803 with 64 CUs, gfx900, gfx906, gfx908, gfx90a, gfx942, gfx95x, gfx103x), which excludes gfx101x: the
  setting does not bring implicit GEMM to a native gfx1010. What the owner's notes measured with it ran with
  HSA_OVERRIDE_GFX_VERSION=10.3.0, where MIOpen sees a gfx1030. With the deprecated solvers off, the direct
  family on gfx1010 is the naive direct solver: slow, a correctness floor;
- MIOPEN_FIND_MODE picks how hard MIOpen searches. MIOpen in ROCm/rocm-libraries (projects/miopen/src/
  find_controls.cpp, GetFindModeValueImpl2) upper-cases the value and accepts NORMAL, FAST, HYBRID, DYNAMIC_HYBRID,
  TRUST_VERIFY, TRUST_VERIFY_FULL, else a number from 1 to 7 (miopen.h: Normal 1, Fast 2, Hybrid 3, the deprecated
  fast hybrid 4, DynamicHybrid 5, TrustVerify 6, TrustVerifyFull 7; 5 is the default). `DEFAULT` is none of
  them: its number parse fails (the 2024 ROCm/MIOpen tree knew neither TRUST_VERIFY name).
"""

from __future__ import annotations

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.doctor.gfx_override import effective
from rdna1_kmgr.userspace import environment_files
from rdna1_kmgr.userspace.profiles import SOLVER_PREFIX

FALSE = ("0", "no", "off", "false", "disable", "disabled")
TRUE = ("1", "yes", "on", "true", "enable", "enabled")
FIND_MODES = (
    "NORMAL",
    "FAST",
    "HYBRID",
    "DYNAMIC_HYBRID",
    "TRUST_VERIFY",
    "TRUST_VERIFY_FULL",
    *(str(n) for n in range(1, 8)),
)
DEPRECATED = "MIOPEN_DEBUG_ENABLE_DEPRECATED_SOLVERS"
GATED_TO = "gfx803, gfx900, gfx906, gfx908, gfx90a and gfx103x"


def wanted(name: str) -> bool:
    return name.startswith("MIOPEN_")


def in_force(found: list[environment_files.Assignment]) -> dict[str, environment_files.Assignment]:
    """Each variable's assignment in force (the process's own, else the last file line), unset ones left out."""
    result = {}
    for name in sorted({a.name for a in found}):
        chosen = effective([a for a in found if a.name == name])
        if chosen is not None:
            result[name] = chosen
    return result


def findings(found: list[environment_files.Assignment], loads: str, checked: str) -> list[Finding]:
    active = in_force(found)
    facts = {"in_force": {k: a.to_json() for k, a in active.items()}}
    if not active:
        return [
            Finding(
                "miopen-settings",
                "ok",
                f"no MIOPEN_* variable is set ({checked})",
                "MIOpen picks among every solver that supports the board",
                "",
                facts,
            )
        ]
    result = []
    for name, a in active.items():
        value = (a.value or "").strip()
        where = f"{name}={value} in {a.where()}"
        boolean = name.startswith(SOLVER_PREFIX) or name in (DEPRECATED, "MIOPEN_DEBUG_GCN_ASM_KERNELS")
        if boolean and value.lower() not in FALSE + TRUE:
            result.append(
                Finding(
                    "miopen-settings",
                    "problem",
                    where,
                    'MIOpen stops with "Invalid value ' 'for env variable" at its first convolution',
                    f"set 0 or 1 in {a.where()}",
                    a.to_json(),
                )
            )
            continue
        if name == SOLVER_PREFIX + "DIRECT" and value.lower() in FALSE:
            result.append(
                Finding(
                    "miopen-settings",
                    "problem",
                    where,
                    "the naive solvers, MIOpen's fallback "
                    "for what no other solver takes, belong to the direct family: without them "
                    'such convolutions fail with "No suitable algorithm"',
                    f"remove it from {a.where()} (an experiment control, not a setting to keep)",
                    a.to_json(),
                )
            )
        elif name.startswith(SOLVER_PREFIX) and value.lower() in TRUE:
            gated = ""
            if name == SOLVER_PREFIX + "IMPLICIT_GEMM" and loads == "gfx1010":
                gated = (
                    "; on gfx1010 MIOpen runs no implicit-GEMM solver (their hardware check lists gfx103x "
                    "but no gfx101x, MIOPEN_DEBUG_ENABLE_DEPRECATED_SOLVERS or not): the setting the owner's "
                    "notes measured worked under HSA_OVERRIDE_GFX_VERSION=10.3.0"
                )
            result.append(
                Finding(
                    "miopen-settings",
                    "warn",
                    f"{where}: does nothing",
                    "MIOpen only reads 0 as switching a family off; 1 does not make a family the " "only one" + gated,
                    f"remove it from {a.where()}, or set the families you do " "not want to 0",
                    a.to_json(),
                )
            )
        elif name.startswith(SOLVER_PREFIX):
            result.append(
                Finding(
                    "miopen-settings",
                    "info",
                    f"{where}: that family is off",
                    "MIOpen chooses among the other families",
                    "",
                    a.to_json(),
                )
            )
        elif name == "MIOPEN_FIND_MODE":
            known = value.upper() in FIND_MODES
            result.append(
                Finding(
                    "miopen-settings",
                    "info" if known else "warn",
                    where,
                    "how long MIOpen searches for a solver on first use"
                    if known
                    else f"not a find mode MIOpen parses ({', '.join(FIND_MODES)}): its number parse fails on "
                    "it; unset, MIOpen uses DYNAMIC_HYBRID (5)",
                    "" if known else f"correct it in {a.where()}",
                    a.to_json(),
                )
            )
        elif name == DEPRECATED and value.lower() in TRUE and loads == "gfx1010":
            result.append(
                Finding(
                    "miopen-settings",
                    "info",
                    where,
                    f"MIOpen's deprecated solvers, kept for {GATED_TO}, also run on gfx1010: that restores the "
                    "old OpenCL direct solvers (untested there by MIOpen); implicit GEMM stays off, a separate "
                    "hardware check excludes gfx101x; the experiment's deprecated-solvers profile measures it",
                    "",
                    a.to_json(),
                )
            )
        else:
            result.append(Finding("miopen-settings", "info", where, "", "", a.to_json()))
    return result
