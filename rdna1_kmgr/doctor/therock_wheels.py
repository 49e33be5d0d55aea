"""TheRock's multi-arch Python packages in a site-packages folder: which are installed, at which versions,
where their ROCm libraries live, and whether the device wheel for the board is there.

From TheRock's RELEASES.md ("Installing multi-arch PyTorch Python packages") and
docs/packaging/python_packaging.md (ROCm/TheRock): `pip install --index-url
https://rocm.nightlies.amd.com/whl-multi-arch/ "torch[device-gfx1010]" "torchvision[device-gfx1010]"` pulls the
host wheels (`torch`, `rocm-sdk-core`, `rocm-sdk-libraries`) and, for the extra, `amd-torch-device-gfx1010`
and `rocm-sdk-device-gfx1010`. The host wheels carry host code only; the device wheels overlay `.kpack`
archives and kernel databases (rocBLAS' Tensile files under `lib/rocblas/library/`) into the host packages'
folders. ROCm's libraries sit in `site-packages/_rocm_sdk_core*/lib` (HIP runtime, comgr, kpack loader) and
`_rocm_sdk_libraries*/lib` (rocBLAS, hipBLASLt, MIOpen); build_tools/packaging/python/templates/rocm/src/
rocm_sdk/_dist_info.py names them. Device wheels are version-locked to their host wheels (`Requires-Dist ==`,
RFC0008): a mismatch is as broken as a missing one. Versions are read from the `*.dist-info` folders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.doctor import kpack
from rdna1_kmgr.doctor.finding import Finding

INDEX = "https://rocm.nightlies.amd.com/whl-multi-arch/"
CORE_GLOB = "_rocm_sdk_core*"
LIBRARIES_GLOB = "_rocm_sdk_libraries*"


@dataclass(frozen=True)
class RocmSdk:
    """TheRock's ROCm in one site-packages folder."""

    site: Path
    trees: tuple[Path, ...]  # _rocm_sdk_core*, _rocm_sdk_libraries* folders
    versions: dict  # normalised distribution name -> version, for every dist-info of the site
    archives: tuple[kpack.KpackArchive, ...]  # in the trees' .kpack folders

    @property
    def core_version(self) -> str | None:
        return self.versions.get("rocm-sdk-core")

    @property
    def libraries_version(self) -> str | None:
        return next((v for k, v in sorted(self.versions.items()) if k.startswith("rocm-sdk-libraries")), None)

    def lib_dirs(self) -> list[Path]:
        return [t / "lib" for t in self.trees if (t / "lib").is_dir()]

    def to_json(self) -> dict:
        return {
            "site": str(self.site),
            "trees": [str(t) for t in self.trees],
            "versions": {k: v for k, v in sorted(self.versions.items()) if _ours(k)},
            "archives": [a.to_json() for a in self.archives],
        }


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them: amd_torch_device_gfx1010 -> amd-torch-device-gfx1010."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _ours(name: str) -> bool:
    return name.startswith(("rocm", "amd-torch", "amd-torchvision", "torch"))


def dist_versions(site: Path) -> dict[str, str]:
    """Every installed distribution of a site-packages folder: name -> version, from METADATA (the folder
    name when METADATA is unreadable)."""
    found = {}
    for info in sorted(site.glob("*.dist-info")):
        name = version = None
        try:
            for line in (info / "METADATA").read_text(errors="replace").splitlines():
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                if key == "Name":
                    name = value.strip()
                elif key == "Version":
                    version = value.strip()
        except OSError:
            pass
        if name is None or version is None:
            stem = info.name[: -len(".dist-info")]
            name, _, version = stem.partition("-")
        found[normalise(name)] = version
    return found


def find(site: Path) -> RocmSdk | None:
    """TheRock's ROCm in `site`, None when the site has none."""
    trees = tuple(sorted(t for pattern in (CORE_GLOB, LIBRARIES_GLOB) for t in site.glob(pattern) if t.is_dir()))
    versions = dist_versions(site)
    if not trees and "rocm-sdk-core" not in versions:
        return None
    archives = tuple(a for t in trees for a in kpack.archives_in(t / ".kpack"))
    return RocmSdk(site, trees, versions, archives)


def device_wheel(package: str, processor: str) -> str:
    """rocm-sdk-device-gfx1010, amd-torch-device-gfx1010."""
    return f"{package}-device-{processor}"


def pip_line(site: Path, sysroot: Path, processor: str, versions: dict[str, str]) -> str:
    """The install command that brings the device wheels for `processor` at the installed host versions, for
    the interpreter that owns `site`."""
    root = site.parents[2] if len(site.parents) > 2 else site
    python = root / "bin/python"
    runner = f"{_shown(python, sysroot)} -m pip" if (root / "pyvenv.cfg").is_file() else "pip"
    wanted = []
    for package in ("torch", "torchvision"):
        if package in versions:
            wanted.append(f'"{package}[device-{processor}]=={versions[package]}"')
    if not wanted:
        core = versions.get("rocm-sdk-core") or versions.get("rocm")
        wanted.append(f'"rocm[libraries,device-{processor}]' + (f'=={core}"' if core else '"'))
    return f"{runner} install --index-url {INDEX} {' '.join(wanted)}"


def _shown(path: Path, sysroot: Path) -> str:
    try:
        return str(Path("/") / path.relative_to(sysroot))
    except ValueError:
        return str(path)


def findings(sdk: RocmSdk, sysroot: Path, board: str, loads: str) -> list[Finding]:
    """The ROCm SDK wheels of one site: their versions and the device wheel for the processor ROCm loads."""
    facts = sdk.to_json()
    core, libraries = sdk.core_version, sdk.libraries_version
    wanted = device_wheel("rocm-sdk", loads)
    device = sdk.versions.get(wanted)
    carried = sorted({a for archive in sdk.archives for a in archive.arches})
    where = f"TheRock ROCm in {sdk.site} (rocm-sdk-core {core or '?'}, rocm-sdk-libraries {libraries or '?'})"
    kernels = f"kpack archives for: {' '.join(carried) or 'no processor'}"
    if device is None:
        return [
            Finding(
                "rocm-sdk",
                "problem",
                f"{where}: {wanted} is NOT installed; {kernels}",
                f"the host wheels carry no device code: every ROCm library call on the {loads} fails "
                '("device kernel image is invalid", kpack_load_code_object)',
                f"install the device wheels: `{pip_line(sdk.site, sysroot, loads, sdk.versions)}`",
                facts,
            )
        ]
    if libraries is not None and device != libraries:
        return [
            Finding(
                "rocm-sdk",
                "problem",
                f"{where}: {wanted} {device} does not match " f"rocm-sdk-libraries {libraries}",
                "device wheels are version-locked to their host wheels: the archives' offsets belong to "
                "the exact host libraries they were split from (TheRock RFC0008)",
                f"reinstall both at one version: `{pip_line(sdk.site, sysroot, loads, sdk.versions)}`",
                facts,
            )
        ]
    level = "ok" if loads in carried or not sdk.archives else "warn"
    seen = f"{where}: {wanted} {device}; {kernels}"
    todo = "" if level == "ok" else f"reinstall {wanted}: its archives are not in the .kpack folders"
    why = "" if loads == board else f"HSA_OVERRIDE_GFX_VERSION makes ROCm load {loads} code, not the board's {board}"
    return [Finding("rocm-sdk", level, seen, why, todo, facts)]
