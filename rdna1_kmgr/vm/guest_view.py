"""What a vm-test guest must see, and the mappings that put it where the guest sees it (virtme_guest.py turns
them into virtme-ng's options; hostroot_guest.py into 9p devices and a mount table that gives the same view).

The guest boots with the host's root file system read-only over 9p, but a host path is not a guest path:
virtme-ng 1.42 and its guest init put their own mounts over parts of that root.

  * vng overlays /etc /lib /home /opt /srv /usr /var /tmp with tmpfs upper layers
    (virtme_ng/run.py, `_get_virtme_overlay_rwdir`);
  * the guest init mounts a fresh tmpfs over /run (`mount_kernel_filesystems`) and empty ones over
    /var/log, /var/tmp, /var/cache, /var/lib/apt and more (`mount_sys_filesystems` in
    virtme/guest/virtme-init; the Rust virtme-ng-init it prefers carries the same list);
  * /root becomes an empty folder unless vng itself runs as root (`setup_root_home`, `virtme_root_user`);
  * /lib/modules becomes a tmpfs with one symlink, /lib/modules/KREL -> the kernel's module folder *as a
    host path*: virtme-run passes `virtme_link_mods=/<module folder relative to the root>`
    (virtme/commands/run.py, "Arrange for modules to end up in the right place") and the init makes the
    link (`mount_kernel_modules`).

So a venv or pipx install under /var/cache, /tmp or a home folder, and an image package unpacked into
/var/cache, are simply not there in the guest ("python3: not found", "Module ttm not found").
Only the operating system itself, /usr (the shell, kmod, the system's Python), is taken from the host's
root as it is. Everything else of ours goes through an explicit --rwdir/--rodir, which the init mounts
after all of the above (`mount_virtme_initmounts` runs after `mount_sys_filesystems` and
`mount_kernel_modules`):

  the run folder (plan, the module under test, the guest scripts, result)   -> /run/rdna1-kmgr, read-write
  the Python installation, when it is not the system's under /usr          -> /run/rdna1-kmgr-python
  rdna1-kmgr's venv, for a workload that needs its site-packages           -> /run/rdna1-kmgr-venv

How each guest finds a kernel unpacked into the cache is the guest's own business: virtme_guest.py shows the
kernel's tree at its own host path (where virtme's module link points), hostroot_guest.py mounts its module
folder at /lib/modules/KREL.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath

from rdna1_kmgr.core.errors import HostError

GUEST_RUN = PurePosixPath("/run/rdna1-kmgr")
GUEST_PYTHON_HOME = PurePosixPath("/run/rdna1-kmgr-python")
GUEST_VENV = PurePosixPath("/run/rdna1-kmgr-venv")
# The host's operating system, which the guest runs from (its root is the host's).
OS_TREE = Path("/usr")
# vng hands --rodir/--rwdir to virtme-run through a shell line, unquoted, and virtme-run accepts only these
# characters in them (virtme/commands/run.py, _SAFE_PATH_PATTERN, less the space the shell would split on).
MAPPABLE = re.compile(r"[A-Za-z0-9_+/.-]+")
GUEST_SCRIPTS = "guest"  # the folder of the run folder the guest side is copied into


@dataclass(frozen=True)
class Mapping:
    """A host folder shown to the guest at `guest`."""

    guest: PurePosixPath
    host: Path
    writable: bool = False


def in_os_tree(path: Path) -> bool:
    return path == OS_TREE or OS_TREE in path.parents


def guest_scripts_source() -> Path:
    """The tool's guest side as installed: qemu/guest/ of the package."""
    return Path(str(resources.files("rdna1_kmgr.qemu") / "guest"))


@dataclass
class GuestView:
    """The mappings of one guest run and the guest's paths of what it runs."""

    run: Path  # the host's run folder
    python: str  # the guest's path of the interpreter for the guest scripts
    mappings: list[Mapping] = field(default_factory=list)
    venv_python: str | None = None  # rdna1-kmgr's own Python in the guest, with its site-packages

    def guest_path(self, host: Path) -> str:
        """The guest's path of a file in the run folder."""
        return str(GUEST_RUN / Path(host).relative_to(self.run))

    def script(self, name: str) -> str:
        return str(GUEST_RUN / GUEST_SCRIPTS / name)

    def show(self, host: Path) -> None:
        """Show one more host folder to the guest, read-only, at its own path."""
        self.mappings.append(Mapping(PurePosixPath(host), Path(host)))

    def pythons(self) -> list[str]:
        """Interpreters a workload may run under, its own venv first (torch lives there, if anywhere)."""
        return list(dict.fromkeys(p for p in (self.venv_python, self.python, "/usr/bin/python3") if p))


def interpreter(executable: str | None = None, base_prefix: str | None = None) -> tuple[str, Mapping | None]:
    """The interpreter the guest runs the guest scripts with (they need only the standard library), and the
    mapping that shows it when it is not the system's: the real binary behind rdna1-kmgr's venv."""
    exe = Path(os.path.realpath(executable or sys.executable))
    base = Path(os.path.realpath(base_prefix or sys.base_prefix))
    if in_os_tree(exe) and in_os_tree(base):
        return str(exe), None
    if base not in exe.parents:
        raise HostError(
            f"rdna1-kmgr's Python {exe} is not inside its installation {base}",
            "install rdna1-kmgr with a regular Python installation (a venv of /usr/bin/python3 is best)",
        )
    # CPython finds its standard library from where its binary is, so the installation can move.
    return str(GUEST_PYTHON_HOME / exe.relative_to(base)), Mapping(GUEST_PYTHON_HOME, base)


def prepare(run: Path, with_venv: bool = False) -> GuestView:
    """Copy the guest scripts into the run folder and say how the guest sees everything."""
    shutil.copytree(guest_scripts_source(), run / GUEST_SCRIPTS, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    python, python_mapping = interpreter()
    mappings = [Mapping(GUEST_RUN, run, writable=True)]
    if python_mapping is not None:
        mappings.append(python_mapping)
    venv_python = None
    if with_venv and sys.prefix != sys.base_prefix:
        venv = Path(sys.prefix)
        mappings.append(Mapping(GUEST_VENV, venv))
        venv_python = str(GUEST_VENV / Path(sys.executable).relative_to(venv))
    return GuestView(run, python, mappings, venv_python)
