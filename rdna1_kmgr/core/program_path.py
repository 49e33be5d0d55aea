"""Which program a bare name runs: the PATH policy the runner (core/runner.py) starts every program under.

Debian and Ubuntu keep the system's programs in the sbin folders, which a normal user's PATH leaves out; under
root, a folder on PATH that someone other than root can change is dropped (docs/security.md).
"""

from __future__ import annotations

import os
import shutil

from rdna1_kmgr.core import trust
from rdna1_kmgr.core.owner import ROOT_PATH

# Debian and Ubuntu keep the system's programs (modinfo, depmod, dkms, mokutil) in the sbin folders, which a
# normal user's PATH leaves out: `rdna1-kmgr status` without sudo must still find them.
SYSTEM_PROGRAMS = "/usr/local/sbin:/usr/sbin:/sbin"


def include_system_programs() -> None:
    """Add SYSTEM_PROGRAMS to this process's PATH where missing: what the tool runs (DKMS's own programs too)
    finds them, after the caller's own folders. Under root only the caller's folders that root alone can change
    stay (absolute, owned by root, writable by nobody else, as core/trust.py checks): a `modprobe` or `dkms` in a
    user's folder that sudo -E or a root shell passed on is never the one root runs, while a folder root itself
    put first (a test's stand-in programs, a prefix of its own) keeps its place. The command line does it once,
    at the start."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    if os.geteuid() == 0:
        path = [d for d in path if os.path.isabs(d) and os.path.isdir(d) and trust.untrusted(d, trust.ROOT) is None]
        wanted = ROOT_PATH.split(os.pathsep)
    else:
        wanted = SYSTEM_PROGRAMS.split(os.pathsep)
    path = list(dict.fromkeys(path))
    path += [d for d in wanted if d not in path]
    os.environ["PATH"] = os.pathsep.join(path)


def which(name: str) -> str | None:
    """The program's path on PATH (or in the system's sbin folders), or None."""
    return shutil.which(name) or shutil.which(name, path=SYSTEM_PROGRAMS)


def located(argv: list[str], env: dict[str, str] | None) -> list[str]:
    """argv with a bare program name that is not on PATH but in the system's sbin folders named by its path."""
    if "/" in argv[0] or shutil.which(argv[0], path=(env or os.environ).get("PATH", os.defpath)):
        return argv
    found = shutil.which(argv[0], path=SYSTEM_PROGRAMS)
    return [found, *argv[1:]] if found else argv
