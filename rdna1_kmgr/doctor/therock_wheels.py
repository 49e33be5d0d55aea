"""TheRock's multi-arch Python packages in a site-packages folder: which are installed, at which versions,
where their ROCm libraries live, and whether the device wheel for the board is there.

From TheRock's RELEASES.md ("Installing multi-arch PyTorch Python packages") and
docs/packaging/python_packaging.md (ROCm/TheRock): `pip install --index-url <the channel's index>
"torch[device-gfx1010]" "torchvision[device-gfx1010]"` (the indexes: therock_indexes.py) pulls the
host wheels (`torch`, `rocm-sdk-core`, `rocm-sdk-libraries`) and, for the extra, `amd-torch-device-gfx1010`
and `rocm-sdk-device-gfx1010`. The host wheels carry host code only; the device wheels overlay `.kpack`
archives and kernel databases (rocBLAS' Tensile files under `lib/rocblas/library/`) into the host packages'
folders. ROCm's libraries sit in `site-packages/_rocm_sdk_core*/lib` (HIP runtime, comgr, kpack loader) and
`_rocm_sdk_libraries*/lib` (rocBLAS, hipBLASLt, MIOpen); build_tools/packaging/python/templates/rocm/src/
rocm_sdk/_dist_info.py names them. Device wheels are version-locked to their host wheels (`Requires-Dist ==`,
RFC0008): a mismatch is as broken as a missing one. Versions are read from the `*.dist-info` folders.

Channels (TheRock's docs/packaging/versioning.md, docs/development/s3_buckets.md and
docs/packaging/legacy_per_family_releases.md): a stable release is `X.Y.Z` (torch `2.12.0+rocm10.1.0`) on the
release index, a prerelease `X.Y.ZrcN` on the prerelease index, a nightly `X.Y.ZaYYYYMMDD` (optionally
`+bkc.YYYYMMDD`) on the nightly index, a dev build `X.Y.Z.devN+<commit>` on the dev index. Legacy per-family
releases (`rocm-sdk-libraries-<family>`, e.g. gfx110X-all) were served from a per-family index of their own and
are no longer produced. A pip line pinned to a release but pointed at the nightly index cannot resolve, and one
that asks a venv holding another torch for `torch[device-gfx1010]` installs nothing: pip_line says which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import user_files
from rdna1_kmgr.doctor import kpack, therock_indexes
from rdna1_kmgr.doctor.finding import Finding

# Legacy per-family releases' index (TheRock's docs/packaging/legacy_per_family_releases.md lines 137 and 325)
LEGACY_INDEX = "https://rocm.nightlies.amd.com/v2/{family}/"
# Where a line that must not touch the owner's venv puts TheRock's torch: a new venv in their home
NEW_VENV = "~/therock-venv"
# A ROCm version as TheRock writes it, per channel (versioning.md's table).
_CHANNEL_VERSIONS = (
    ("release", re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")),
    ("prerelease", re.compile(r"[0-9]+\.[0-9]+\.[0-9]+rc[0-9]+")),
    ("nightly", re.compile(r"[0-9]+\.[0-9]+\.[0-9]+a20[0-9]{6}")),
    ("bkc", re.compile(r"[0-9]+\.[0-9]+\.[0-9]+a20[0-9]{6}[.+]bkc\.20[0-9]{6}")),
    ("dev", re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.dev[0-9]+(\+[0-9a-f]+)?")),
)
_TORCH_LOCAL = re.compile(r"[^+]+\+rocm(?P<rocm>[0-9].*)")
_LEGACY_LIBRARIES = re.compile(r"rocm-sdk-libraries-(?P<family>gfx[0-9a-z]+(-[a-z]+)?)")
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


def dist_versions(site: Path, within: Path | None = None) -> dict[str, str]:
    """Every installed distribution of a site-packages folder: name -> version, from METADATA's headers (the
    folder name when METADATA is unreadable, or leads out of `within`)."""
    found = {}
    for info in sorted(site.glob("*.dist-info")):
        name = version = None
        try:
            head = user_files.read_head(info / "METADATA", within, user_files.METADATA_HEAD)
            for line in head.decode(errors="replace").splitlines():
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


def find(site: Path, within: Path | None = None) -> RocmSdk | None:
    """TheRock's ROCm in `site`, None when the site has none; a user's files read only inside `within`."""
    trees = tuple(sorted(t for pattern in (CORE_GLOB, LIBRARIES_GLOB) for t in site.glob(pattern) if t.is_dir()))
    versions = dist_versions(site, within)
    if not trees and "rocm-sdk-core" not in versions:
        return None
    archives = tuple(a for t in trees for a in kpack.archives_in(t / ".kpack", within))
    return RocmSdk(site, trees, versions, archives)


def device_wheel(package: str, processor: str) -> str:
    """rocm-sdk-device-gfx1010, amd-torch-device-gfx1010."""
    return f"{package}-device-{processor}"


@dataclass(frozen=True)
class Channel:
    """Where an install came from: its channel, the ROCm version that says so, and the pip index serving it."""

    name: str  # release, prerelease, nightly, dev, legacy (per-family) or unknown
    rocm: str | None
    index: str
    family: str | None = None  # legacy per-family releases: the family, e.g. gfx110X-all

    def covers(self, processor: str) -> bool:
        """Whether a legacy family's wheels carry code for `processor` (gfx101X-dgpu covers gfx1010)."""
        if self.family is None:
            return True
        stem = self.family.split("-")[0]
        return re.fullmatch(stem.replace("X", "[0-9a-f]"), processor) is not None

    def to_json(self) -> dict:
        return {"channel": self.name, "rocm": self.rocm, "index": self.index, "family": self.family}


def channel_of(versions: dict[str, str]) -> Channel:
    """The channel of a site's TheRock install, from rocm-sdk-core's version, else torch's `+rocm` local version,
    else a legacy `rocm-sdk-libraries-<family>` distribution."""
    for name in versions:
        legacy = _LEGACY_LIBRARIES.fullmatch(name)
        if legacy:
            family = re.sub(r"x(?=-|$)", "X", legacy.group("family"))
            return Channel("legacy", versions[name], LEGACY_INDEX.format(family=family), family)
    rocm = versions.get("rocm-sdk-core") or versions.get("rocm")
    if rocm is None:
        local = _TORCH_LOCAL.fullmatch(versions.get("torch", ""))
        rocm = local.group("rocm") if local else None
    for name, pattern in _CHANNEL_VERSIONS:
        if rocm is not None and pattern.fullmatch(rocm):
            return Channel(name, rocm, therock_indexes.indexes(name, rocm)[0])
    return Channel("unknown", rocm, therock_indexes.indexes("nightly")[0])


def pip_line(site: Path, sysroot: Path, processor: str, versions: dict[str, str], replace: bool = False) -> str:
    """The install command that brings TheRock's code for `processor`, written to work as printed, with its
    channel named.

    Into the environment that owns `site` (a venv's or conda env's own python, never a bare `pip`) when that
    holds TheRock's multi-arch install: its channel's index for the build's date, pinned to the installed host
    versions, which declare the `device-<gfx>` extra. Otherwise into a new venv (NEW_VENV): where the
    environment holds another torch (`replace`: pip answers "Requirement already satisfied ... does not provide
    the extra" and installs nothing), a legacy per-family install (no device extras), or a system Python (the
    distribution's, PEP 668)."""
    root = site.parents[2] if len(site.parents) > 2 else site
    own_env = (root / "pyvenv.cfg").is_file() or (root / "conda-meta").is_dir()
    channel = channel_of(versions)
    why_new = (
        "its torch is not TheRock's multi-arch build, and pip keeps an installed torch as it is"
        if replace
        else f"the legacy per-family {channel.family} wheels have no device extras"
        if channel.name == "legacy"
        else f"{_shown(site, sysroot)} is a system Python's, which pip must not change (PEP 668)"
        if not own_env
        else ""
    )

    def line(name: str, pinned: bool, new: bool) -> str:
        urls = therock_indexes.indexes(name, channel.rocm if pinned else None)
        where = f"--index-url {urls[0]}" + "".join(f" --extra-index-url {url}" for url in urls[1:])
        if new:
            return (
                f"python3 -m venv {NEW_VENV} && {NEW_VENV}/bin/python -m pip install {where} "
                f'"torch[device-{processor}]" "torchvision[device-{processor}]"'
            )
        wanted = []
        for package in ("torch", "torchvision"):
            if package in versions:
                pin = f"=={versions[package]}" if pinned and versions[package] else ""
                wanted.append(f'"{package}[device-{processor}]{pin}"')
        if not wanted:
            core = versions.get("rocm-sdk-core") or versions.get("rocm")
            wanted.append(f'"rocm[libraries,device-{processor}]' + (f'=={core}"' if core and pinned else '"'))
        return f"{_shown(root / 'bin/python', sysroot)} -m pip install {where} {' '.join(wanted)}"

    if channel.name == "unknown" and not why_new:
        why_new = (
            f"the installed ROCm version {channel.rocm} names no channel TheRock publishes"
            if channel.rocm
            else "the installed ROCm names no channel"
        )
    if why_new:
        return (
            f"`{line('nightly', False, True)}` (a new venv: {why_new}; TheRock's nightly channel, or its release "
            f"channel: `{line('release', False, True)}`)"
        )
    # Another channel needs a new venv too: pip keeps the installed torch, whichever index the line names
    other = "release" if channel.name != "release" else "nightly"
    return (
        f"`{line(channel.name, True, False)}` ({channel.name} channel, ROCm {channel.rocm}, as installed; "
        f"the {other} channel instead, in a new venv: `{line(other, False, True)}`)"
    )


def _shown(path: Path, sysroot: Path) -> str:
    try:
        return str(Path("/") / path.relative_to(sysroot))
    except ValueError:
        return str(path)


def findings(sdk: RocmSdk, sysroot: Path, board: str, loads: str) -> list[Finding]:
    """The ROCm SDK wheels of one site: their versions, channel and the device wheel for the board. The wanted
    device code is always the board's own: under HSA_OVERRIDE_GFX_VERSION ROCm loads another processor's
    code, and the fix is to remove the override (gfx-override), never to install that processor's wheel."""
    channel = channel_of(sdk.versions)
    facts = {**sdk.to_json(), "channel": channel.to_json()}
    core, libraries = sdk.core_version, sdk.libraries_version
    wanted = device_wheel("rocm-sdk", board)
    device = sdk.versions.get(wanted)
    carried = sorted({a for archive in sdk.archives for a in archive.arches})
    where = (
        f"TheRock ROCm in {sdk.site} (rocm-sdk-core {core or '?'}, rocm-sdk-libraries {libraries or '?'}; "
        f"{channel.name} channel)"
    )
    kernels = f"kpack archives for: {' '.join(carried) or 'no processor'}"
    override = (
        ""
        if loads == board
        else f"; HSA_OVERRIDE_GFX_VERSION makes ROCm load {loads} code instead: remove it (see gfx-override), "
        f"do not install {loads}'s device wheel"
    )
    pip = pip_line(sdk.site, sysroot, board, sdk.versions)
    if channel.name == "legacy":
        level = "ok" if channel.covers(board) else "problem"
        return [
            Finding(
                "rocm-sdk",
                level,
                f"{where}: legacy per-family wheels for {channel.family}"
                + ("" if level == "ok" else f", which carry no {board} code"),
                "per-family wheels carry their family's kernels in the libraries themselves (no device wheels)"
                + ("" if level == "ok" else f": every ROCm library call on the {board} fails")
                + override,
                "" if level == "ok" else f"install TheRock's multi-arch wheels: {pip}",
                facts,
            )
        ]
    if device is None:
        return [
            Finding(
                "rocm-sdk",
                "problem",
                f"{where}: {wanted} is NOT installed; {kernels}",
                f"the host wheels carry no device code: every ROCm library call on the {board} fails "
                '("device kernel image is invalid", kpack_load_code_object)' + override,
                f"install the device wheels: {pip}",
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
                f"reinstall both at one version: {pip}",
                facts,
            )
        ]
    level = "ok" if board in carried or not sdk.archives else "warn"
    seen = f"{where}: {wanted} {device}; {kernels}"
    todo = "" if level == "ok" else f"reinstall {wanted}: its archives are not in the .kpack folders"
    return [Finding("rocm-sdk", level, seen, override.lstrip("; "), todo, facts)]
