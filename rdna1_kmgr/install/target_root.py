"""The file system that install, rollback and status act on: `/` on a real machine.

The tests point RDNA1_KMGR_ROOT at a scratch tree (lib/modules/KREL, etc/modprobe.d, boot, sys, proc) so
that real dkms, depmod, modinfo and lsinitramfs run fast against a module of their own without touching
the machine's kernels. Every path and tool option that depends on the root is made here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import tool_env
from rdna1_kmgr.core.errors import UsageError

ROOT_ENV = tool_env.ROOT  # listed, with its check, in core/tool_env.py
# Where kmod reads modprobe configuration, most important first; a file name in an earlier folder hides
# the same name in later ones (modprobe.d(5)).
MODPROBE_DIRS = ("etc/modprobe.d", "run/modprobe.d", "usr/local/lib/modprobe.d", "lib/modprobe.d", "usr/lib/modprobe.d")


@dataclass(frozen=True)
class TargetRoot:
    path: Path = Path("/")

    @classmethod
    def from_env(cls) -> TargetRoot:
        """`/`, or the folder RDNA1_KMGR_ROOT names once it passes the check of the tool's own roots (a tree a
        user could change would let them aim root's restores: core/tool_env.py)."""
        value = os.environ.get(ROOT_ENV)
        if not value:
            return cls()
        path = Path(value)
        if not path.is_absolute() or not path.is_dir():
            raise UsageError(f"{ROOT_ENV}={value!r} is not an absolute directory", "unset it (it is for tests)")
        return cls(tool_env.moved_root(ROOT_ENV, "/"))

    @property
    def is_system(self) -> bool:
        return self.path.resolve() == Path("/")

    def modules_dir(self, kernel: str) -> Path:
        return self.path / "lib/modules" / kernel

    def kernel_image_installed(self, kernel: str) -> bool:
        """The kernel itself installed (its image in /boot, or its modules), not only its headers: an initramfs
        can be made for it."""
        return (self.boot_dir / f"vmlinuz-{kernel}").is_file() or (self.modules_dir(kernel) / "kernel").is_dir()

    @property
    def modprobe_dir(self) -> Path:
        return self.path / "etc/modprobe.d"

    def modprobe_dirs(self) -> list[Path]:
        return [self.path / rel for rel in MODPROBE_DIRS]

    @property
    def boot_dir(self) -> Path:
        return self.path / "boot"

    @property
    def sys_module(self) -> Path:
        return self.path / "sys/module"

    @property
    def proc_cmdline(self) -> Path:
        return self.path / "proc/cmdline"

    def _basedir(self) -> list[str]:
        return [] if self.is_system else ["-b", str(self.path)]

    def depmod_command(self, kernel: str) -> list[str]:
        return ["depmod", *self._basedir(), kernel]

    def modinfo_command(self, kernel: str, module: str) -> list[str]:
        return ["modinfo", *self._basedir(), "-k", kernel, "-n", module]

    def dkms_options(self) -> list[str]:
        """Where `dkms install` copies modules to (DKMS 3 takes --installtree; /lib/modules is its default)."""
        return [] if self.is_system else [f"--installtree={self.path / 'lib/modules'}"]
