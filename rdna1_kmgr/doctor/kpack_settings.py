"""The kpack loader's own environment, read as rocm-kpack's kpack_cache_create reads it (ROCm/rocm-kpack,
runtime/src: the variables are resolved once when a library creates its cache):

- ROCM_KPACK_DISABLE: on when set, not empty and not starting with `0`; every kpack_load_code_object then
  returns KPACK_ERROR_NOT_IMPLEMENTED, so every kernel of TheRock's split libraries fails to load;
- ROCM_KPACK_PATH: a colon-separated list that replaces the search paths the libraries carry in their
  `.rocm_kpack_ref` markers (the device wheels' archives beside them are then not looked at);
- ROCM_KPACK_PATH_PREFIX: a colon-separated list searched before those paths;
- ROCM_KPACK_DEBUG: on like DISABLE; the loader then says on stderr which archives it opened and which
  processor it looked for (what to set when an operator fails with "device kernel image is invalid").
"""

from __future__ import annotations

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.doctor.miopen_settings import in_force
from rdna1_kmgr.userspace import environment_files

DISABLE = "ROCM_KPACK_DISABLE"
PATH = "ROCM_KPACK_PATH"
PATH_PREFIX = "ROCM_KPACK_PATH_PREFIX"
DEBUG = "ROCM_KPACK_DEBUG"
NAMES = (DISABLE, PATH, PATH_PREFIX, DEBUG)


def wanted(name: str) -> bool:
    return name in NAMES


def switched_on(value: str) -> bool:
    """As kpack_cache_create tests DISABLE and DEBUG: not empty and not starting with '0'."""
    return value != "" and not value.startswith("0")


def findings(found: list[environment_files.Assignment], checked: str) -> list[Finding]:
    active = in_force(found)
    if not active:
        return [
            Finding(
                "kpack-settings",
                "ok",
                f"no ROCM_KPACK_* variable is set ({checked})",
                "the kpack loader searches the archives the libraries name (the device wheels')",
                "",
                {"in_force": {}},
            )
        ]
    result = []
    for name, a in active.items():
        value = a.value or ""
        where = f"{name}={value} in {a.where()}"
        if name == DISABLE and switched_on(value):
            level, why = (
                "problem",
                (
                    "the kpack loader refuses every load (KPACK_ERROR_NOT_IMPLEMENTED): every kernel of TheRock's "
                    "split libraries and PyTorch fails to load"
                ),
            )
            todo = f"remove it from {a.where()}"
        elif name == PATH and value:
            level, why = (
                "warn",
                (
                    f"it replaces the search paths the libraries carry: only {', '.join(value.split(':'))} are "
                    "searched, not the device wheels' .kpack folders"
                ),
            )
            todo = f"remove it from {a.where()} unless those folders hold the gfx1010 archives"
        elif name == PATH_PREFIX and value:
            level, why, todo = "info", "searched before the libraries' own paths", ""
        elif name == DEBUG and switched_on(value):
            level, why, todo = "info", "the kpack loader logs which archives it opens to stderr", ""
        else:
            level, why, todo = "info", "off as the loader reads it (empty or starting with 0)", ""
        result.append(Finding("kpack-settings", level, where, why, todo, a.to_json()))
    return result
