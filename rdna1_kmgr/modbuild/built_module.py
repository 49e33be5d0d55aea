"""Which module `build` made for a kernel, and the render manifest it was made from.

`build` leaves the module in the DKMS tree (/var/lib/dkms/rdna1-amdgpu/<version>/<kernel>/<arch>/module)
and the render's manifest in the package source (/usr/src/rdna1-amdgpu-<version>/rdna1-manifest.json).
Commands that take over from `build` (vm-test, install) find both here instead of asking the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import BuildError, UsageError
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.render.manifest import Manifest


@dataclass(frozen=True)
class BuiltModule:
    path: Path
    kernel: str | None
    package_version: str | None
    manifest: Manifest | None  # the render's manifest.json, when known

    @property
    def selftest_cases(self) -> int | None:
        return self.manifest.selftest_cases if self.manifest else None


def for_kernel(kernel: str, trees: dkms.Trees | None = None) -> BuiltModule:
    """The built (or installed) rdna1-amdgpu module for `kernel`; the most recently built when several are."""
    trees = trees or dkms.Trees.from_env()
    dkms.require_dkms()
    entries = [
        e for e in dkms.status(dkms.PACKAGE_NAME, trees) if e.kernel == kernel and e.state in ("built", "installed")
    ]
    found = []
    for entry in entries:
        package = dkms.Package(dkms.PACKAGE_NAME, entry.version)
        try:
            found.append((package, dkms.built_module(package, kernel, trees)))
        except BuildError:  # a DKMS entry whose module file is gone is no build to test
            continue
    if not found:
        raise UsageError(
            f"no rdna1-amdgpu build for kernel {kernel}",
            f"run `rdna1-kmgr build --kernel {kernel}` first, or give --module",
        )
    package, path = max(found, key=lambda item: item[1].stat().st_mtime)
    return BuiltModule(path, kernel, package.version, _manifest(package.source_dir(trees) / dkms.MANIFEST_NAME))


def for_path(path: Path, manifest: Path | None = None, trees: dkms.Trees | None = None) -> BuiltModule:
    """A module given by path; its manifest from `manifest`, else from its DKMS package when it lives in one."""
    trees = trees or dkms.Trees.from_env()
    path = Path(path).resolve()
    if manifest is not None and not Path(manifest).is_file():
        raise UsageError(f"manifest {str(manifest)!r} does not exist", "give the manifest.json of the render")
    version = kernel = None
    try:
        # <dkms>/<name>/<version>/<kernel>/<arch>/module/amdgpu.ko
        rel = path.relative_to(trees.dkms.resolve() / dkms.PACKAGE_NAME).parts
        if len(rel) == 5 and rel[3] == "module":
            version, kernel = rel[0], rel[1]
    except ValueError:
        pass
    if manifest is None and version is not None:
        manifest = dkms.Package(dkms.PACKAGE_NAME, version).source_dir(trees) / dkms.MANIFEST_NAME
    return BuiltModule(path, kernel, version, _manifest(manifest) if manifest else None)


def _manifest(path: Path) -> Manifest | None:
    try:
        return Manifest.read(path)
    except FileNotFoundError:
        return None
