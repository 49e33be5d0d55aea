"""Where state lives, and the check that root may write there.

Each root can be moved with an environment variable (tests do). Every root is checked before its first use,
moved or not (M4 of issue 40): an absolute path, no symbolic link on the way, every existing folder on the way
owned by root (or by the user running the tool, when that is not root: it can only harm itself) and not writable
by group or others, a sticky root-owned folder above it (/tmp) excepted: core/trust.py's check, the same as for
the commands root runs. A folder that does not exist yet is made by the tool, root's, under a checked parent.

State and log roots are private: make_dirs creates them and every folder under them 0700 (journals, backups,
plans and logs are root's alone); the cache stays 0755 (apt's sandbox user writes below it).
"""

import os
from pathlib import Path

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.trust import untrusted

STATE_ENV = "RDNA1_KMGR_STATE"
CACHE_ENV = "RDNA1_KMGR_CACHE"
LOG_ENV = "RDNA1_KMGR_LOG"

_checked: set[tuple[str, int]] = set()


def _root(env: str, default: str) -> Path:
    path = Path(os.environ.get(env, default))
    key = (str(path), os.geteuid())
    if key not in _checked:
        check_root(path, env)
        _checked.add(key)
    return path


def check_root(path: Path, env: str) -> None:
    """Refuse, in one line, a root folder someone other than root (or the caller) could change under the tool."""
    problem = root_problem(path)
    if problem:
        raise HostError(
            f"refusing {path} as a folder of the tool: {problem}",
            f"make it and its parents root's and not writable by group or others, or unset {env}",
        )


def root_problem(path: Path) -> str | None:
    """What makes `path` unsafe as a root the tool writes under, or None: core/trust.py's check, trusting root
    and the caller, refusing links, passing what the tool will make."""
    if not path.is_absolute():
        return "not an absolute path"
    if ".." in path.parts:
        return "it holds '..'"
    return untrusted(path, frozenset({0, os.geteuid()}), links=False, missing_ok=True, folder=True)


def state_dir() -> Path:
    return _root(STATE_ENV, "/var/lib/rdna1-kmgr")


def cache_dir() -> Path:
    return _root(CACHE_ENV, "/var/cache/rdna1-kmgr")


def log_dir() -> Path:
    return _root(LOG_ENV, "/var/log/rdna1-kmgr")


def private_roots() -> list[Path]:
    """The roots whose folders are root's alone (0700)."""
    return [state_dir(), log_dir()]
