"""PyTorch builds on this machine and whether their GPU code runs on the board.

Found by file, never by running an interpreter: torch/version.py says the version and the HIP it was built
against (None for a CPU or CUDA build), torch/lib/libtorch_hip.so carries the kernels as offload bundles,
and a ROCm wheel brings its own rocBLAS/MIOpen/hipBLASLt in torch/lib. pytorch.org's ROCm wheels carry no
gfx1010 code ("HIP error: invalid device function" on RDNA1, pytorch/pytorch#132570). TheRock's multi-arch
wheels (gfx101X re-enabled by ROCm/TheRock#4159) split it: libtorch_hip.so is host-only with a
`.rocm_kpack_ref` marker, the kernels are in `torch/.kpack/torch_<gfx>.kpack` from the device wheel
`amd-torch-device-<gfx>`, and ROCm comes as the rocm-sdk wheels beside it (therock_wheels.py). A missing
device wheel makes every operator fail with "device kernel image is invalid" (kpack_load_code_object), as a
public TheRock install recipe warns for the torch[device-*] extra combined with pip --overrides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import user_files
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.doctor import code_objects, kpack, rocm_libraries, therock_wheels
from rdna1_kmgr.doctor.finding import Finding

SYSTEM_SITES = (
    "usr/lib/python3/dist-packages",
    "usr/lib/python3*/site-packages",
    "usr/local/lib/python3*/dist-packages",
    "usr/local/lib/python3*/site-packages",
    "opt/*/lib/python3*/site-packages",
)
USER_SITES = (
    ".local/lib/python3*/site-packages",
    "*/lib/python3*/site-packages",
    ".*/lib/python3*/site-packages",
    "*/*/lib/python3*/site-packages",
    "*/envs/*/lib/python3*/site-packages",
)


@dataclass
class TorchBuild:
    site: Path
    version: str
    hip: str | None
    cuda: str | None
    kernels: code_objects.CodeObjects = field(default_factory=code_objects.CodeObjects)
    bundled: list[rocm_libraries.Install] = field(default_factory=list)
    marker: kpack.KpackRef | None = None  # libtorch_hip is host-only (TheRock's kpack split)
    archives: list[kpack.KpackArchive] = field(default_factory=list)  # torch/.kpack
    versions: dict = field(default_factory=dict)  # the site's distributions, from dist-info
    sdk: therock_wheels.RocmSdk | None = None

    def archives_for(self, processor: str) -> list[kpack.KpackArchive]:
        return [a for a in self.archives if any(code_objects.runs_on(t, processor) for t in a.arches)]

    def to_json(self) -> dict:
        return {
            "site": str(self.site),
            "version": self.version,
            "hip": self.hip,
            "cuda": self.cuda,
            "libtorch_hip": self.kernels.to_json(),
            "bundled": [i.to_json() for i in self.bundled],
            "kpack_marker": self.marker.to_json() if self.marker else None,
            "kpack_archives": [a.to_json() for a in self.archives],
            "rocm_sdk": self.sdk.to_json() if self.sdk else None,
        }


def sites_of(sysroot: Path, home: Path | None, named: list[str]) -> list[Path]:
    """site-packages folders to look in: those of interpreters and venvs the user named, the system's,
    and the user's own (~/.local, venvs and conda environments up to two levels below home; one that is a link
    out of the home is not the user's, and not read)."""
    sites: list[Path] = []
    for spec in named:
        sites += _named_sites(sysroot, spec)
    for pattern in SYSTEM_SITES:
        sites += sorted(sysroot.glob(pattern))
    if home is not None and home.is_dir():
        for pattern in USER_SITES:
            sites += [s for s in sorted(home.glob(pattern)) if user_files.leads_inside(s, home)]
    unique: list[Path] = []
    for site in sites:
        if site.is_dir() and site.resolve() not in {s.resolve() for s in unique}:
            unique.append(site)
    return unique


def _named_sites(sysroot: Path, spec: str) -> list[Path]:
    path = Path(spec)
    path = path if not path.is_absolute() or sysroot.resolve() == Path("/") else sysroot / spec.lstrip("/")
    if not path.exists():
        raise UsageError(f"--python {spec!r} does not exist", "give a python3 interpreter or a venv's folder")
    if path.is_file():  # an interpreter: its venv (bin/python3 -> the folder holding pyvenv.cfg)
        root = path.parent.parent
        if (root / "pyvenv.cfg").is_file() or list(root.glob("lib/python3*/site-packages")):
            path = root
        else:
            return []  # a system interpreter: the system's sites are read anyway
    if path.name in ("site-packages", "dist-packages"):
        return [path]
    return sorted(path.glob("lib/python3*/site-packages")) + sorted(path.glob("lib/python3*/dist-packages"))


def venv_of(site: Path) -> Path:
    """<venv>/lib/python3.X/site-packages -> <venv> (/usr/lib/python3/dist-packages -> /usr): the folder a site's
    files are read inside of (core/user_files.py), so that a link in a user's venv leads nowhere else."""
    return site.parent.parent.parent


def find(sites: list[Path], processors: tuple[str, ...]) -> list[TorchBuild]:
    builds = []
    for site in sites:
        within = venv_of(site)
        try:
            text = user_files.read_text(site / "torch" / "version.py", within, user_files.PYTHON_FILE)
        except OSError:
            continue
        fields = _version_fields(text)
        build = TorchBuild(site, fields.get("__version__") or "?", fields.get("hip"), fields.get("cuda"))
        lib = site / "torch" / "lib"
        for library in sorted(lib.glob("libtorch_hip*.so*")):
            build.kernels.add(code_objects.scan_binary(library, within))
            build.marker = build.marker or kpack.marker(library, within)
        build.archives = kpack.archives_in(site / "torch" / ".kpack", within)
        build.versions = therock_wheels.dist_versions(site, within)
        build.sdk = therock_wheels.find(site, within)
        folders = ([lib] if lib.is_dir() else []) + (build.sdk.lib_dirs() if build.sdk else [])
        build.bundled = rocm_libraries.find_installs(folders, processors, within)
        builds.append(build)
    return builds


def _version_fields(text: str) -> dict[str, str | None]:
    fields: dict[str, str | None] = {}
    for match in re.finditer(r"^(__version__|hip|cuda)\s*(?::[^=]*)?=\s*(.+)$", text, re.M):
        raw = match.group(2).strip()
        fields[match.group(1)] = None if raw == "None" else raw.strip("'\"")
    return fields


NVIDIA = 0x10DE


def findings(
    builds: list[TorchBuild],
    sites: list[Path],
    board: str,
    loads: str,
    sysroot: Path = Path("/"),
    gpu_vendors: frozenset[int] = frozenset(),
) -> list[Finding]:
    """`gpu_vendors`: the PCI vendors of the machine's display devices. A CUDA or CPU-only torch is a PROBLEM
    where the RDNA1 board is there and no NVIDIA GPU: nothing of it can use the board."""
    if not builds:
        return [
            Finding(
                "torch",
                "info",
                f"no PyTorch found ({len(sites)} site-packages folders read)",
                "",
                "name a venv or interpreter with --python if PyTorch lives elsewhere",
                {"sites": [str(s) for s in sites]},
            )
        ]
    result = []
    for build in builds:
        where = f"torch {build.version} in {build.site}"
        facts = build.to_json()
        if not build.hip:
            kind = f"a CUDA {build.cuda} build" if build.cuda else "a CPU-only build"
            amd_only = bool(gpu_vendors) and NVIDIA not in gpu_vendors
            result.append(
                Finding(
                    "torch",
                    "problem" if amd_only else "warn",
                    f"{where}: {kind}, no HIP",
                    "it cannot use an AMD GPU at all"
                    + ("; this machine has no NVIDIA GPU, so it runs on the CPU or not at all" if amd_only else ""),
                    f"install a ROCm build of PyTorch that carries {board} code: pytorch.org's ROCm "
                    "wheels do not; TheRock's multi-arch wheels do: "
                    + therock_wheels.pip_line(build.site, sysroot, board, {"torch": ""}, replace=True),
                    facts,
                )
            )
            continue
        if build.marker is not None:
            result.append(_split_finding(build, where, sysroot, board, loads))
            if build.sdk is not None:
                result += therock_wheels.findings(build.sdk, sysroot, board, loads)
            result += [rocm_libraries.install_finding(i, board, loads) for i in build.bundled]
            continue
        targets = " ".join(sorted(build.kernels.targets)) or "none readable"
        unread = f"; {len(build.kernels.unreadable)} compressed bundle(s) unread" if build.kernels.unreadable else ""
        override = (
            f"HSA_OVERRIDE_GFX_VERSION makes ROCm load {loads} code instead: remove it (see gfx-override)"
            if loads != board
            else ""
        )
        if build.kernels.has(board):
            level = "ok" if loads == board else "warn"
            seen, why, todo = f"{where} (HIP {build.hip}): libtorch_hip carries {board} code", override, ""
        elif not build.kernels.targets and build.kernels.unreadable:
            level, seen = "warn", f"{where} (HIP {build.hip}): its GPU code could not be read{unread}"
            why, todo = "", build.kernels.unreadable[0]
        else:
            level = "problem"
            seen = f"{where} (HIP {build.hip}): libtorch_hip has NO {board} code (it has: {targets}){unread}"
            why = 'every GPU operator fails with "HIP error: invalid device function"'
            todo = (
                f"install TheRock's multi-arch PyTorch, which carries {board} code: "
                + therock_wheels.pip_line(build.site, sysroot, board, _unpinned(build), replace=build.sdk is None)
                + "; do not reach for HSA_OVERRIDE_GFX_VERSION"
            )
        result.append(Finding("torch", level, seen, why, todo, facts))
        if build.sdk is not None:  # TheRock's legacy per-family wheels: no kpack split, rocm-sdk wheels beside
            result += therock_wheels.findings(build.sdk, sysroot, board, loads)
        for install in build.bundled:
            result.append(rocm_libraries.install_finding(install, board, loads))
    return result


def _unpinned(build: TorchBuild) -> dict[str, str]:
    """Versions for a pip line that replaces `build`: TheRock's own distributions say the channel (a legacy
    per-family install among them); torch itself is not pinned, its version is not a multi-arch one."""
    ours = build.versions if build.sdk is not None else {}
    return {**ours, "torch": "", "torchvision": ""}


def _split_finding(build: TorchBuild, where: str, sysroot: Path, board: str, loads: str) -> Finding:
    """A TheRock torch: host-only libtorch_hip, the kernels in torch/.kpack from amd-torch-device-<gfx>. The
    wanted device wheel is the board's own, also under HSA_OVERRIDE_GFX_VERSION (see gfx-override)."""
    facts = {
        **build.to_json(),
        "channel": therock_wheels.channel_of({"torch": build.version, **build.versions}).to_json(),
    }
    wheel = therock_wheels.device_wheel("amd-torch", board)
    device = build.versions.get(wheel)
    torch = build.versions.get("torch", build.version)
    found = build.archives_for(board)
    carried = " ".join(sorted({a for archive in build.archives for a in archive.arches})) or "none"
    pip = therock_wheels.pip_line(build.site, sysroot, board, {"torch": torch, **build.versions})
    override = (
        f"HSA_OVERRIDE_GFX_VERSION makes ROCm load {loads} code instead: remove it (see gfx-override), do not "
        f"install {therock_wheels.device_wheel('amd-torch', loads)}"
        if loads != board
        else ""
    )
    if found and device is not None and device != torch:
        return Finding(
            "torch",
            "problem",
            f"{where}: {wheel} {device} does not match torch {torch}",
            "device wheels are locked to their host wheel's exact version: the archive belongs to "
            "another libtorch_hip",
            f"reinstall both at one version: {pip}",
            facts,
        )
    if found:
        names = ", ".join(f"torch/.kpack/{a.path.name}" for a in found)
        version = f" ({wheel} {device})" if device else ""
        return Finding(
            "torch",
            "ok" if loads == board else "warn",
            f"{where} (HIP {build.hip}): {board} kernels in {names}{version}",
            override,
            "",
            facts,
        )
    return Finding(
        "torch",
        "problem",
        f"{where} (HIP {build.hip}): libtorch_hip is host-only (kpack marker) and "
        f"torch/.kpack has no {board} archive ({wheel} {'not installed' if device is None else device}; "
        f"archives for: {carried})",
        'every GPU operator fails with "HIP error: device kernel image is invalid" (kpack_load_code_object '
        "failed); ROCM_KPACK_DEBUG=1 makes the loader say which archive it looked for"
        + (f"; {override}" if override else ""),
        f"install the device wheels: {pip}",
        facts,
    )
