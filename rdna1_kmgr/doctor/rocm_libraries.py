"""The ROCm libraries installed (AMD's /opt/rocm* trees and the distribution's), and the GPU code they carry.

A library family is data: its shared-object names, the folders of code objects it loads at run time and
what the board loses without it. For each place a family is installed, the shared objects are read for
offload bundles and the data folders for code-object files (their names say the target, which is how ROCm
picks them; the files that name the board's processor are opened to confirm it). A library TheRock split
(a `.rocm_kpack_ref` marker, kpack.py) has its kernels in `.kpack` archives beside its package: those whose
table of contents names the library count as its code.

hipBLASLt is built for no gfx101X target: TheRock excludes it (ROCm/TheRock cmake/therock_amdgpu_targets.cmake,
gfx1010's EXCLUDE_TARGET_PROJECTS, issue #1062), and Debian's libhipblaslt ships no gfx1010 file (the
doctor's Debian test lists the package).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.doctor import code_objects, kpack
from rdna1_kmgr.doctor.code_objects import CodeObjects
from rdna1_kmgr.doctor.finding import Finding


@dataclass(frozen=True)
class Family:
    id: str
    name: str
    libs: tuple[str, ...]  # shared-object name prefixes: librocblas.so
    data: tuple[str, ...]  # folders (relative to the library folder or the ROCm root) of run-time code objects
    lacking: str  # what a gfx1010 board loses when the family has no code for it
    needed: bool  # lacking gfx1010 code is a problem (else a warning)
    prebuilt: bool = True  # False: the family compiles its kernels at run time, no code objects expected
    not_built_for: str = ""  # why no build has gfx101X code by design: its absence is a fact, not a fault


FAMILIES = (
    Family(
        "rocblas",
        "rocBLAS",
        ("librocblas.so",),
        ("rocblas", "../share/rocblas"),
        "every matrix product (torch.matmul, nn.Linear) and MIOpen's GEMM convolutions fail with "
        '"invalid device function" or fall back to nothing',
        needed=True,
    ),
    Family(
        "miopen",
        "MIOpen",
        ("libMIOpen.so",),
        ("../share/miopen/db", "miopen"),
        "Conv2d: MIOpen compiles its kernels for the board at run time (needs ROCm's compiler support for "
        "gfx1010); precompiled kernel databases only spare that time",
        needed=False,
        prebuilt=False,
    ),
    Family(
        "hipblaslt",
        "hipBLASLt",
        ("libhipblaslt.so",),
        ("hipblaslt",),
        "int8 and FP8 matrix products (torch._int_mm, torch._scaled_mm) fail; fp32, fp16 and bf16 products "
        "go through rocBLAS, which PyTorch uses where hipBLASLt has no code",
        needed=False,
        not_built_for="hipBLASLt is not built for gfx101X by design (TheRock's therock_amdgpu_targets.cmake, "
        "ROCm/TheRock#1062); nothing to install",
    ),
    Family(
        "hip",
        "HIP runtime",
        ("libamdhip64.so",),
        (),
        "nothing that uses ROCm runs: it is the runtime every ROCm library and PyTorch calls",
        needed=True,
        prebuilt=False,
    ),
)

# Where libraries live, relative to the sysroot: AMD's trees first, then the distribution's paths.
LIB_GLOBS = ("opt/rocm*/lib", "opt/rocm*/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/local/lib")
CODE_SUFFIXES = (".hsaco", ".co", ".kdb", ".dat")


@dataclass
class Install:
    family: Family
    lib_dir: Path
    libraries: list[Path]
    code: CodeObjects = field(default_factory=CodeObjects)  # inside the shared objects
    files: CodeObjects = field(default_factory=CodeObjects)  # code-object and database files, by name
    confirmed: dict = field(default_factory=dict)  # processor -> files whose content was read and agrees
    mismatched: list[str] = field(default_factory=list)  # files whose name and content disagree
    split: bool = False  # a library carries TheRock's kpack marker: its kernels live in archives
    archives: list = field(default_factory=list)  # kpack.KpackArchive whose TOC names one of the libraries

    def archive_targets(self) -> set[str]:
        return {a for archive in self.archives for a in archive.arches}

    def has(self, processor: str) -> bool:
        return (
            self.code.has(processor)
            or self.files.has(processor)
            or any(code_objects.runs_on(t, processor) for t in self.archive_targets())
        )

    def targets(self) -> list[str]:
        return sorted(set(self.code.targets) | set(self.files.targets) | self.archive_targets())

    def to_json(self) -> dict:
        return {
            "family": self.family.id,
            "lib_dir": str(self.lib_dir),
            "libraries": [str(p) for p in self.libraries],
            "in_libraries": self.code.to_json(),
            "code_object_files": dict(sorted(self.files.targets.items())),
            "confirmed": self.confirmed,
            "mismatched": self.mismatched,
            "kpack_split": self.split,
            "kpack_archives": [a.to_json() for a in self.archives],
        }


def lib_dirs(sysroot: Path) -> list[Path]:
    found: list[Path] = []
    for pattern in LIB_GLOBS:
        for folder in sorted(sysroot.glob(pattern)):
            if folder.is_dir() and not folder.is_symlink() and folder.resolve() not in {f.resolve() for f in found}:
                found.append(folder)
    return found


def find_installs(folders: list[Path], processors: tuple[str, ...], within: Path | None = None) -> list[Install]:
    """Every family installed in one of `folders`, read for code objects; files naming one of `processors`
    are opened to confirm their name. In a user's venv, only files whose real path is inside `within`."""
    installs = []
    for folder in folders:
        for family in FAMILIES:
            libraries = _libraries(folder, family) if folder.is_dir() else []
            if not libraries:
                continue
            install = Install(family, folder, libraries)
            for library in libraries:
                install.code.add(code_objects.scan_binary(library, within))
            for data in family.data:
                _read_data_folder(install, (folder / data), processors, within)
            _read_archives(install, processors, within)
            installs.append(install)
    return installs


def _read_archives(install: Install, processors: tuple[str, ...], within: Path | None) -> None:
    """The kpack archives of a split library: those its marker points at for `processors` and those of its
    package's .kpack folder, kept when their table of contents names one of the libraries."""
    markers = [m for m in (kpack.marker(lib, within) for lib in install.libraries) if m is not None]
    if not markers:
        return
    install.split = True
    paths = {p for m in markers for proc in processors for p in m.candidates(proc) if p.is_file()}
    paths |= {p.resolve() for p in (install.lib_dir.parent / ".kpack").glob("*.kpack")}
    for path in sorted(paths):
        archive = kpack.read_archive(path, within)
        if archive.error is None and any(archive.holds_kernels_of(lib) for lib in install.libraries):
            install.archives.append(archive)


def _libraries(folder: Path, family: Family) -> list[Path]:
    """The family's shared objects in `folder`, each file once (librocblas.so.4 is a link to .so.4.4)."""
    found: dict[Path, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(family.libs) and path.is_file():
            real = path.resolve()
            if real not in found or not path.is_symlink():
                found[real] = path
    return sorted(found.values())


def _read_data_folder(install: Install, folder: Path, processors: tuple[str, ...], within: Path | None) -> None:
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        if not path.name.endswith(CODE_SUFFIXES) or not path.is_file():
            continue
        named = code_objects.targets_in_name(path.name)
        install.files.targets.update(named)
        wanted = [p for p in processors if any(code_objects.runs_on(t, p) for t in named)]
        if wanted and path.name.endswith((".hsaco", ".co")):
            inside = code_objects.scan_binary(path, within)
            if any(inside.has(p) for p in wanted):
                for p in wanted:
                    install.confirmed[p] = install.confirmed.get(p, 0) + 1
            elif not inside.unreadable:
                install.mismatched.append(str(path))


def findings(
    installs: list[Install], board: str, loads: str, bundled: Sequence[Install] = (), rocm_torch: bool = False
) -> list[Finding]:
    """One finding per installed family and place; `board` is the processor, `loads` the one ROCm loads
    code for (another one under HSA_OVERRIDE_GFX_VERSION). `bundled`: the copies Python packages bring
    (PyTorch's torch/lib, TheRock's _rocm_sdk_* trees), reported with their PyTorch and not again here (each
    library is listed once). `rocm_torch`: a ROCm
    PyTorch was found; without one a library that is not installed is a fact, not a fault."""
    result = []
    for family in FAMILIES:
        places = [i for i in installs if i.family is family]
        own = sorted({str(i.lib_dir) for i in bundled if i.family is family})
        if not places and own:
            continue  # PyTorch's own copy has its finding already, with the PyTorch that brings it
        if not places:
            result.append(
                Finding(
                    family.id,
                    "warn" if family.needed and rocm_torch else "info",
                    f"{family.name}: not installed (looked in {', '.join('/' + g for g in LIB_GLOBS)})",
                    f"without it {family.lacking}" if family.needed else "",
                    "nothing to do if PyTorch brings its own ROCm (TheRock's wheels do); install "
                    "ROCm's or the distribution's package only for programs that use the "
                    "system's"
                    if family.needed
                    else "",
                )
            )
        for install in places:
            result.append(install_finding(install, board, loads))
    return result


def install_finding(install: Install, board: str, loads: str) -> Finding:
    family = install.family
    where = f"{family.name} in {install.lib_dir} ({', '.join(p.name for p in install.libraries)})"
    facts = install.to_json()
    targets = install.targets()
    counts = _counts(install, loads)
    if not family.prebuilt and not targets:
        return Finding(
            family.id,
            "info",
            f"{where}: found; no prebuilt GPU code (compiled at run time)",
            f"for {family.name}, {family.lacking}",
            "",
            facts,
        )
    others = " ".join(t for t in targets if not code_objects.runs_on(t, loads)) or "none"
    if install.has(loads):
        level = "warn" if install.mismatched else "ok"
        own = f"; the board's own {board}: {'present' if install.has(board) else 'ABSENT'}" if loads != board else ""
        seen = f"{where}: {loads} code present ({counts}){own}; other targets: {others}"
        todo = (
            f"check the files whose name and content disagree: {install.mismatched[:3]}" if install.mismatched else ""
        )
        return Finding(family.id, level, seen, f"ROCm loads {loads} code on this board", todo, facts)
    level = "problem" if family.needed and family.prebuilt else "warn" if family.prebuilt else "info"
    if family.not_built_for and not install.has(board):
        level = "info"
    if targets:
        carried = f"it carries {' '.join(targets)}"
    elif install.split:  # TheRock's split library: its code is in the device wheels' archives, none here
        carried = "its kernels live in kpack archives, and no installed archive holds them"
    else:
        carried = "it carries no GPU code"
    seen = f"{where}: NO {loads} code; {carried}"
    why = f"ROCm loads {loads} code on this board; without it {family.lacking}"
    if family.not_built_for:
        why = f"{family.not_built_for}: {family.lacking}"
    if loads != board:
        fix = "remove HSA_OVERRIDE_GFX_VERSION (see gfx-override)" if install.has(board) else f"use a build for {board}"
        todo = f"this library has {'' if install.has(board) else 'no '}{board} code of the board's own; {fix}"
    elif install.split:
        todo = (
            f"install the device wheels for {board} (see rocm-sdk and torch: TheRock's split libraries keep "
            "their kernels in the device wheels' .kpack archives)"
            if family.needed
            else ""
        )
    else:
        todo = (
            f"use a {family.name} with {board} code: TheRock's multi-arch wheels (device-{board}) carry it; "
            f"AMD's /opt/rocm 6.3 and 6.4 no longer ship {board} rocBLAS files; Debian's librocblas (trixie, "
            "sid) does"
            if family.needed
            else ""
        )
    if family.not_built_for and not install.has(board):
        todo = ""
    return Finding(family.id, level, seen, why, todo, facts)


def _counts(install: Install, processor: str) -> str:
    parts = []
    bundles = sum(n for t, n in install.code.targets.items() if code_objects.runs_on(t, processor))
    if bundles:
        parts.append(f"{bundles} of {install.code.bundles + install.code.compressed} bundles in the libraries")
    files = sum(n for t, n in install.files.targets.items() if code_objects.runs_on(t, processor))
    if files:
        confirmed = install.confirmed.get(processor, 0)
        parts.append(f"{files} code-object files" + (f", {confirmed} opened and confirmed" if confirmed else ""))
    archives = [a for a in install.archives if any(code_objects.runs_on(t, processor) for t in a.arches)]
    if archives:
        parts.append("kernels in " + ", ".join(f"{a.path.parent.name}/{a.path.name}" for a in archives))
    return "; ".join(parts)
