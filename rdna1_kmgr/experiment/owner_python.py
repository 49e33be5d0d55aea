"""The owner's PyTorch the cells run: `--python PATH`, else the first ROCm build doctor finds (venvs and conda
under the user's home, the system's site-packages); checked by running it once before any cell.

Finding it only reads files. Running it, the probe as every cell, is done as its owner (core/owner.py), never
as root, and only when nobody else can change that venv."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import owner as owners
from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.core.owner import Owner
from rdna1_kmgr.doctor import torch_builds

PROBE = (
    "import json, torch; print(json.dumps({'torch': torch.__version__, "
    "'hip': getattr(torch.version, 'hip', None), 'cuda': getattr(torch.version, 'cuda', None)}))"
)


@dataclass(frozen=True)
class OwnerPython:
    path: str
    torch: str
    hip: str | None
    cuda: str | None
    owner: Owner  # who it runs as


def default(sysroot: Path, home: Path | None) -> str:
    """The interpreter of the first PyTorch with HIP that doctor finds."""
    sites = torch_builds.sites_of(sysroot, home, [])
    builds = [b for b in torch_builds.find(sites, ("gfx1010",)) if b.hip]
    for build in builds:
        python = interpreter_of(build.site)
        if python is not None:
            return str(python)
    raise UsageError(
        f"no PyTorch for ROCm found ({len(sites)} site-packages folders read, as doctor reads them)",
        "give --python PATH: the python of the venv that holds your ROCm PyTorch",
    )


def interpreter_of(site: Path) -> Path | None:
    """<venv>/lib/python3.X/site-packages -> <venv>/bin/python3; the system's -> /usr/bin/python3.X."""
    root = site.parent.parent.parent
    for candidate in (root / "bin" / "python3", root / "bin" / "python", root / "bin" / site.parent.name):
        if candidate.is_file():
            return candidate
    return None


def given(path: str | None, env: dict[str, str]) -> OwnerPython | None:
    """The --python the owner gave, run once: a Python with torch, or a UsageError in one line (bad input is said
    before the machine is looked at); None when none was given. Whether its torch can use the board is
    usable()'s, after the board: on a machine without one that is what the owner needs to hear first."""
    return with_torch(path, env) if path else None


def ready(given: OwnerPython | None, sysroot: Path, env: dict[str, str]) -> OwnerPython:
    """The Python the experiment runs, once the board is there: the one given, or the first ROCm PyTorch doctor
    finds (default); either with a HIP torch (usable), or a UsageError in one line."""
    if given is None:
        # the home searched is the one of who asked (sudo's user, checked)
        given = with_torch(default(sysroot, owners.invoking_home()), env)
    return usable(given)


def with_torch(path: str, env: dict[str, str]) -> OwnerPython:
    if not Path(path).is_file():
        raise UsageError(f"--python {path!r} is not a file", "give the python of the venv that holds your PyTorch")
    owner = owners.of_python(path)
    try:
        result = runner.run(
            [path, "-c", PROBE],
            timeout=300,
            check=False,
            env=env,
            cwd="/",  # `-c` imports from the working folder first: root's own, never one a user can write to
            doing=f"{path} -c 'import torch'",
            as_user=owner,
        )
    except HostError as err:
        raise UsageError(f"--python {path!r} cannot be run: {err.what}", "give a python3 interpreter") from None
    lines = [line for line in str(result.stdout).splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise UsageError(
            f"--python {path!r} is not a Python with torch ({result.last_error_line()})",
            "give the python of the venv that holds your PyTorch",
        )
    facts = json.loads(lines[-1])
    return OwnerPython(path, facts["torch"], facts["hip"], facts.get("cuda"), owner)


def usable(python: OwnerPython) -> OwnerPython:
    """Its torch is a HIP build (a ROCm PyTorch), or a UsageError in one line."""
    if not python.hip:
        kind = f"a CUDA {python.cuda} build" if python.cuda else "a CPU-only build"
        raise UsageError(
            f"torch {python.torch} of {python.path} is {kind} (no HIP): it cannot use the board",
            "give --python of a ROCm PyTorch with gfx1010 code (see `rdna1-kmgr doctor`)",
        )
    return python
