"""Run a command as root in a private mount namespace, where the folders an attack aims at are overlays whose
writes land in the test's own folder, and chosen files are bind-mounted over the machine's: so an attack on
/etc/profile.d, /var/lib/dkms or /usr/sbin/dkms can be driven for real, through the real command, and whatever
it does (or the tool does) leaves the machine as it was.

`unshare --mount --propagation private`: mounts made inside are seen by nothing outside, and end with the
command. Needs root and util-linux's unshare; callers skip otherwise (`NEEDS`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rdna1_kmgr.core import tool_env

NEEDS = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a private mount namespace: needs root and unshare"
)

# The folders a root command of the tool writes or reads trust from; each becomes an overlay.
# (/var/lib, /var/log and /var/cache whole: the tool's own folders there may not exist yet)
SYSTEM_FOLDERS = ("/etc", "/var/lib", "/var/log", "/var/cache", "/usr/src")


def tool_command() -> list[str]:
    """The installed command as the owner runs it (install.sh's launcher, `python -I`), else this interpreter,
    isolated the same way."""
    launcher = Path(sys.executable).parent / "rdna1-kmgr"
    if launcher.is_file() and launcher.read_text().splitlines()[0].endswith(" -I"):
        return [str(launcher)]
    return [sys.executable, "-I", "-c", "from rdna1_kmgr.cli import main; main()"]


def run(
    argv: list[str],
    env: dict[str, str],
    scratch: Path,
    overlays: tuple[str, ...] = SYSTEM_FOLDERS,
    binds: tuple[tuple[Path, str], ...] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """argv as root with exactly `env`, in a private mount namespace: each folder of `overlays` that exists is
    an overlay over itself (its upper layer in `scratch`, kept for the next run with the same scratch), then each (file, target) of `binds` is bind-mounted
    onto target (which must exist), and root's marker of a test run is gone (/run an overlay too)."""
    steps = []
    for number, folder in enumerate(f for f in overlays if os.path.isdir(f)):
        upper, work = scratch / f"overlay{number}/upper", scratch / f"overlay{number}/work"
        upper.mkdir(parents=True, exist_ok=True)  # the same scratch: a later run sees what an earlier wrote
        work.mkdir(parents=True, exist_ok=True)
        steps.append(
            f"mount -t overlay overlay -o lowerdir={shlex.quote(folder)},upperdir={shlex.quote(str(upper))},"
            f"workdir={shlex.quote(str(work))} {shlex.quote(folder)}"
        )
    steps += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for src, dst in binds]
    # as on a user's machine: no test run root set up (its marker lets the tests' apt configuration through)
    run_folder = scratch / "run"
    (run_folder / "upper").mkdir(parents=True, exist_ok=True)
    (run_folder / "work").mkdir(parents=True, exist_ok=True)
    steps += [
        f"mount -t overlay overlay -o lowerdir=/run,upperdir={run_folder}/upper,workdir={run_folder}/work /run",
        f"rm -f {shlex.quote(str(tool_env.TEST_MARKER))}",
    ]
    script = " && ".join([*steps, 'exec "$@"'])
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def base_env() -> dict[str, str]:
    """What a root shell has before the attacker's additions: root's PATH, HOME and a locale."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
    }


def written(scratch: Path, folder: str) -> list[str]:
    """What runs with this scratch wrote under `folder` (one of SYSTEM_FOLDERS), as paths relative to it."""
    number = [f for f in SYSTEM_FOLDERS if os.path.isdir(f)].index(folder)
    upper = scratch / f"overlay{number}/upper"
    return sorted(str(p.relative_to(upper)) for p in upper.rglob("*")) if upper.is_dir() else []
