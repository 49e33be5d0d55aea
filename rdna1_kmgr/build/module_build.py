"""`rdna1-kmgr build`: a kernel release in, a patched, signed, verified amdgpu.ko out (through DKMS).

kernel release -> prerequisites (headers, dkms, tools) -> the kernel's exact driver source -> render
the series -> DKMS package -> dkms add/build -> verify (vermagic, signature, parameters, aliases)
-> drop this package's older versions for that kernel.

The second half (`build_package`) knows nothing about amdgpu: it takes any DKMS package of a
kernel-shaped tree and a series, which is how the tests drive it with a tiny module.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import distro

from rdna1_kmgr.build import dkms_package as dkms
from rdna1_kmgr.build import module_checks, prerequisites, signing
from rdna1_kmgr.core import runner, user_input
from rdna1_kmgr.core.errors import BuildError, HostError, KmgrError
from rdna1_kmgr.core.paths import cache_dir, log_dir
from rdna1_kmgr.core.progress import Progress, count_sources
from rdna1_kmgr.host.rdna1_boards import format_id
from rdna1_kmgr.render.patch_series import render
from rdna1_kmgr.source import cache_entry, kernel_source

AMD_TREE = "drivers/gpu/drm/amd"
# A patch line declaring a module parameter: the series' rdna1_* parameters must be in the module.
_PARAMETER = re.compile(r"^\+.*\bmodule_param(?:_named)?\(\s*(rdna1_\w+)", re.MULTILINE)


def default_jobs() -> int:
    return (os.cpu_count() or 1) + 1


# --- which kernel -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    release: str  # uname -r style: 6.1.0-56-amd64
    package_version: str | None  # the distro's version of that kernel: 6.1.192-2
    note: str | None = None  # said to the user when the release was chosen for them


def distro_current_kernel() -> str | None:
    """The release the distro's kernel metapackage points to today (installed one first, else apt's candidate)."""
    if not runner.which("dpkg-query"):
        return None  # dnf and pacman hosts: their place is here, not written yet
    arch = runner.run(["dpkg", "--print-architecture"]).stdout.strip()
    metas = [f"linux-image-{arch}", f"linux-headers-{arch}", "linux-image-generic", "linux-headers-generic"]
    for meta in metas:
        proc = runner.run(["dpkg-query", "--show", "--showformat=${Depends}", meta], check=False)
        found = _release_in_depends(proc.stdout) if proc.returncode == 0 else None
        if found:
            return found
    for meta in metas:
        proc = runner.run(["apt-cache", "depends", meta], check=False)
        found = _release_in_depends(proc.stdout) if proc.returncode == 0 else None
        if found:
            return found
    return None


def _release_in_depends(text: str) -> str | None:
    m = re.search(r"\blinux-(?:image|headers)-(\d+\.\d+[^\s,()|]*)", text)
    return m.group(1) if m else None


def resolve_kernel(requested: str | None) -> Kernel:
    """--kernel when given; else the running kernel, or, when that is not the distro's, the distro's current one."""
    if requested is not None:
        release = user_input.kernel_release(requested)
        return Kernel(release, kernel_source.debian_kernel_version(release))
    running = os.uname().release
    version = kernel_source.debian_kernel_version(running)
    if version is not None:
        return Kernel(running, version)
    current = distro_current_kernel()
    if current is None:
        raise HostError(f"the running kernel {running} is not a {distro.name() or 'distribution'} kernel "
                        "and no distribution kernel is known", "give --kernel RELEASE")
    return Kernel(current, kernel_source.debian_kernel_version(current),
                  note=f"the running kernel {running} is not a {distro.name() or 'distribution'} kernel; "
                       f"building for the distribution's current kernel {current} (give --kernel to choose)")


# --- the package half --------------------------------------------------------------------------------


@dataclass
class PackageBuild:
    package: dkms.Package
    kernel: str
    module: Path
    report: module_checks.ModuleReport
    keys: signing.KeyPair
    reused: bool
    compiled: int
    seconds: float
    log: Path | None
    removed: list[str] = field(default_factory=list)  # older versions removed for this kernel
    kept: list[str] = field(default_factory=list)  # older versions left because they are installed


def ccache_env() -> dict[str, str]:
    """Route the compiler through ccache when it is installed (Debian and Ubuntu put its masquerade links
    in /usr/lib/ccache). The base directory makes the kbuild trees' absolute paths relative in its keys."""
    masquerade = Path("/usr/lib/ccache")
    if not shutil.which("ccache") or not masquerade.is_dir():
        return {}
    return {
        "PATH": f"{masquerade}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "CCACHE_DIR": str(cache_dir() / "ccache"),
        "CCACHE_BASEDIR": str(cache_dir() / "kbuild"),
        "CCACHE_NOHASHDIR": "1",
        # Depend mode keys on kbuild's own -MMD output, so a miss costs no extra preprocessor run (a cold
        # build stays close to a plain one).
        "CCACHE_DEPEND": "1",
    }


def signing_env(keys: signing.KeyPair) -> dict[str, str]:
    # DKMS reads these from its environment unless /etc/dkms/framework.conf sets them; the key is read in place.
    return {"mok_signing_key": str(keys.key), "mok_certificate": str(keys.cert)}


def build_package(
    package: dkms.Package,
    kernel: str,
    source_root: Path,
    subtrees: list[str],
    series_dir: Path,
    keys: signing.KeyPair,
    devices: list[int],
    parameters: list[str],
    jobs: int | None = None,
    description: str = "",
    trees: dkms.Trees | None = None,
    stream: TextIO | None = None,
) -> PackageBuild:
    """Build (or reuse) one package version for one kernel, verified; on failure nothing of it is left."""
    trees = trees or dkms.Trees.from_env()
    stream = stream if stream is not None else sys.stderr
    # DKMS has no locking of its own: a second run for the same kernel waits here instead of
    # deleting the first one's build directory under it.
    with cache_left_as_found(), cache_entry.exclusive(dkms.kbuild_root(package.name), kernel):
        return _build_package(package, kernel, source_root, subtrees, series_dir, keys, devices, parameters,
                              jobs, description, trees, stream)


def _build_package(package, kernel, source_root, subtrees, series_dir, keys, devices, parameters, jobs,
                   description, trees, stream) -> PackageBuild:
    started = time.monotonic()

    def checked(module: Path) -> module_checks.ModuleReport:
        return module_checks.verify(module, kernel, keys.cert, devices, parameters=parameters)

    if dkms.is_built(package, kernel, trees):
        dkms.assemble(package, source_root, subtrees, series_dir, trees, description)  # dkms.conf up to date
        module = dkms.built_module(package, kernel, trees)
        try:
            report = checked(module)
        except BuildError as err:
            # Built before, but not as asked now (another key, say): build it again, unless it is installed
            # (rebuilding would uninstall it behind the install journal's back).
            if dkms.is_installed(package, kernel, trees):
                raise BuildError(f"{package.ref} is installed for {kernel} and fails a check: {err.what}",
                                 "roll the install back first (`rdna1-kmgr rollback`), then build again") from None
            stream.write(f"rdna1-kmgr: rebuilding {package.ref}: the earlier build fails a check ({err.what})\n")
            dkms.remove(package, trees, kernel)
        else:
            removed, kept = _remove_older(package, kernel, trees)
            return PackageBuild(package, kernel, module, report, keys, reused=True, compiled=0,
                                seconds=time.monotonic() - started, log=None, removed=removed, kept=kept)

    created_source = not package.source_dir(trees).exists()
    log = log_dir() / f"build-{package.name}-{package.version}-{kernel}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    progress = Progress(f"building {package.module.name} for {kernel}", total=_objects_total(source_root, subtrees),
                        stream=stream)
    try:
        dkms.assemble(package, source_root, subtrees, series_dir, trees, description)
        dkms.add(package, trees)
        outcome = dkms.build(package, kernel, trees, log, jobs or default_jobs(),
                             env={**ccache_env(), **signing_env(keys)},
                             on_line=progress.feed, on_tick=progress.tick)
        _check_signed_with(outcome, keys)
        report = checked(outcome.module)
    except BaseException:
        progress.finish("failed")
        _discard(package, kernel, trees, created_source)
        raise
    progress.finish("done")
    removed, kept = _remove_older(package, kernel, trees)
    return PackageBuild(package, kernel, outcome.module, report, keys, reused=False, compiled=outcome.compiled,
                        seconds=time.monotonic() - started, log=outcome.log, removed=removed, kept=kept)


def _objects_total(source_root: Path, subtrees: list[str]) -> int:
    return sum(count_sources(source_root / sub) for sub in subtrees)


def _check_signed_with(outcome: dkms.BuildOutcome, keys: signing.KeyPair) -> None:
    """DKMS says which key it signed with; a framework.conf setting would override ours."""
    if outcome.certificate is None:
        raise BuildError("DKMS did not sign the module", f"see {outcome.log}")
    if Path(outcome.certificate) != keys.cert:
        raise BuildError(f"DKMS signed with {outcome.certificate}, not {keys.cert}",
                         "/etc/dkms/framework.conf sets mok_certificate; remove that line or pass it as --key/--cert")


def _discard(package: dkms.Package, kernel: str, trees: dkms.Trees, created_source: bool) -> None:
    """Undo a failed build in DKMS: the package if this run made it, else only this kernel's build of it."""
    try:
        if created_source:
            dkms.remove(package, trees)
        else:
            dkms.remove(package, trees, kernel)
            shutil.rmtree(package.version_dir(trees) / "build", ignore_errors=True)
    except KmgrError:
        pass  # the original error matters more


def _cache_entries(root: Path, depth: int = 3) -> set[Path]:
    """The cache's folders and files down to `depth` (src/<version>, kbuild/<package>/<release>, locks...)."""
    found: set[Path] = set()
    level = [root] if root.is_dir() else []
    found.update(level)
    for _ in range(depth):
        below = []
        for folder in level:
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        found.add(Path(entry.path))
                        if entry.is_dir(follow_symlinks=False):
                            below.append(Path(entry.path))
            except OSError:
                continue
        level = below
    return found


@contextmanager
def cache_left_as_found():
    """When the work inside fails, remove what it added to the cache (an unpacked source, a download, a kbuild
    tree, ccache's folder, lock files), so a refused or failed build leaves the cache as it was. What was
    there before stays, with whatever the failed run added inside it."""
    root = cache_dir()
    before = _cache_entries(root)
    try:
        yield
    except BaseException:
        for path in sorted(_cache_entries(root) - before, key=lambda p: len(p.parts)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise


def _remove_older(package: dkms.Package, kernel: str, trees: dkms.Trees) -> tuple[list[str], list[str]]:
    """Other versions of this package built for this kernel go; installed ones stay (install owns those)."""
    removed, kept = [], []
    for entry in dkms.status(package.name, trees):
        if entry.version == package.version or entry.kernel != kernel:
            continue
        if entry.state == "installed":
            kept.append(entry.version)
            continue
        dkms.remove(dkms.Package(package.name, entry.version, package.module), trees, kernel)
        removed.append(entry.version)
    return removed, kept


# --- the whole build -----------------------------------------------------------------------------------


@dataclass
class BuildRequest:
    kernel: str | None = None
    source: str | None = None
    sha256: str | None = None
    quirks: list[str] | None = None
    devices: list[int] | None = None
    jobs: int | None = None
    yes: bool = False
    no_install: bool = False
    key: str | None = None
    cert: str | None = None


def series_parameters(series_dir: Path) -> list[str]:
    """The rdna1_* module parameters the series adds."""
    found: list[str] = []
    for name in dkms.read_series(series_dir):
        for param in _PARAMETER.findall((series_dir / name).read_text(errors="replace")):
            if param not in found:
                found.append(param)
    return found


def source_tree(request: BuildRequest, kernel: Kernel) -> Path:
    """The driver source of exactly this kernel's version, unpacked in the cache (or the tree given)."""
    if request.source:
        tree = kernel_source.resolve_source_option(request.source, request.sha256)
        if kernel.package_version:
            kernel_source.require_version(tree, kernel.package_version)
        return tree
    return kernel_source.fetch_kernel_source(kernel.release)


def run(request: BuildRequest, confirm: Callable[[prerequisites.InstallPlan], bool] | None = None,
        stream: TextIO | None = None) -> dict:
    """Everything `rdna1-kmgr build` does; returns the JSON result."""
    stream = stream if stream is not None else sys.stderr
    started = time.monotonic()
    kernel = resolve_kernel(request.kernel)
    if kernel.note:
        stream.write(f"rdna1-kmgr: {kernel.note}\n")
    keys = signing.resolve(request.key, request.cert)
    with cache_left_as_found():
        return _run(request, kernel, keys, confirm, stream, started)


def _run(request: BuildRequest, kernel: Kernel, keys: signing.KeyPair, confirm, stream: TextIO,
         started: float) -> dict:
    prerequisites.ensure_prerequisites(kernel.release, yes=request.yes, no_install=request.no_install, confirm=confirm)
    if kernel.package_version is None:  # the headers may have come with the prerequisites
        kernel = Kernel(kernel.release, kernel_source.debian_kernel_version(kernel.release), kernel.note)
    if signing.ensure(keys):
        stream.write(f"rdna1-kmgr: made the signing key {keys.key} and certificate {keys.cert}; "
                     "enroll it for Secure Boot with `rdna1-kmgr keys enroll`\n")
    tree = source_tree(request, kernel)

    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-series-") as tmp:
        series = Path(tmp) / "series"
        manifest = render(tree, series, request.quirks, request.devices)
        package = dkms.Package(dkms.PACKAGE_NAME, dkms.package_version(manifest["kernel_version"],
                                                                        manifest["patchset_sha256"]))
        devices = [int(d, 16) for d in manifest["devices"]]
        quirk_ids = [q["id"] if isinstance(q, dict) else q for q in manifest["quirks"]]
        built = build_package(
            package, kernel.release, tree, [AMD_TREE], series, keys, devices, series_parameters(series),
            jobs=request.jobs,
            description=f"amdgpu of Linux {manifest['kernel_version']} with the RDNA1 quirks "
                        f"{' '.join(quirk_ids)} for {' '.join(manifest['devices'])}",
            stream=stream,
        )
    cert = signing.certificate_info(keys.cert)
    return {
        "kernel": kernel.release,
        "kernel_version": manifest["kernel_version"],
        "kernel_package_version": kernel.package_version,
        "note": kernel.note,
        "source": str(tree),
        "package": package.name,
        "package_version": package.version,
        "package_source": str(package.source_dir(dkms.Trees.from_env())),
        "module": str(built.module),
        "sha256": built.report.sha256,
        "vermagic": built.report.vermagic.strip(),
        "signer": built.report.signer,
        "certificate": str(keys.cert),
        "certificate_sha1": cert.sha1_fingerprint,
        "signing_key": str(keys.key),
        "parameters": list(built.report.parameters),
        "quirks": quirk_ids,
        "devices": [format_id(d) for d in devices],
        "patchset_sha256": manifest["patchset_sha256"],
        "reused": built.reused,
        "compiled_objects": built.compiled,
        "log": str(built.log) if built.log else None,
        "removed_versions": built.removed,
        "kept_installed_versions": built.kept,
        "seconds": round(time.monotonic() - started, 1),
    }


# --- --dry-run ------------------------------------------------------------------------------------------


def plan(request: BuildRequest) -> list[str]:
    """What `run` would do, step by step, with the exact commands; changes nothing on the system."""
    kernel = resolve_kernel(request.kernel)
    keys = signing.resolve(request.key, request.cert)
    trees = dkms.Trees.from_env()
    jobs = request.jobs or default_jobs()
    lines = [f"note: {kernel.note}"] if kernel.note else []
    lines.append(f"kernel {kernel.release}" + (f" (package {kernel.package_version})" if kernel.package_version else ""))

    install = prerequisites.manager_for_host().plan(kernel.release)
    if install.empty:
        lines.append("prerequisites: all installed")
    else:
        verb = "missing (--no-install: stop here)" if request.no_install else "install"
        lines.append(f"prerequisites {verb}: {' '.join(install.missing)}")
        lines += [f"  {step}" for step in install.describe()]

    tree = _planned_source(request, kernel, lines)

    if keys.key.exists() or keys.cert.exists():
        lines.append(f"sign with {keys.key} and {keys.cert} ({keys.convention})")
    else:
        lines.append(f"generate the signing key {keys.key} (mode 0600) and certificate {keys.cert}")

    if tree is None:
        lines.append(f"render the series; package {dkms.PACKAGE_NAME}-<kernel version>+p<patch-set hash> "
                     f"under {trees.source}")
        lines.append(f"  {' '.join(dkms.command(['add', '-m', dkms.PACKAGE_NAME, '-v', '<version>'], trees))}")
        lines.append(f"  {' '.join(dkms.command(['build', '-m', dkms.PACKAGE_NAME, '-v', '<version>', '-k', kernel.release, '-j', str(jobs)], trees))}")
        return lines

    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-series-") as tmp:
        manifest = render(tree, Path(tmp) / "series", request.quirks, request.devices)
        params = series_parameters(Path(tmp) / "series")
    package = dkms.Package(dkms.PACKAGE_NAME, dkms.package_version(manifest["kernel_version"],
                                                                    manifest["patchset_sha256"]))
    lines.append(f"render {len(manifest['patches'])} patches (patch set {manifest['patchset_sha256'][:12]}) "
                 f"for devices {' '.join(manifest['devices'])}")
    have_dkms = shutil.which("dkms") is not None
    if have_dkms and dkms.is_built(package, kernel.release, trees):
        lines.append(f"reuse {package.ref}, already built for {kernel.release} (verified again)")
    else:
        lines.append(f"write {package.source_dir(trees)}/ ({AMD_TREE}, patches/, dkms.conf)")
        lines.append(f"  {' '.join(dkms.command(dkms.add_args(package), trees))}")
        lines.append(f"  {' '.join(dkms.command(dkms.build_args(package, kernel.release, jobs), trees))}"
                     f"   (kbuild tree {dkms.kbuild_root(package.name) / kernel.release}"
                     f"{', ccache' if ccache_env() else ''})")
    lines.append(f"verify vermagic {kernel.release}, the signature against {keys.cert} (openssl), "
                 f"parameters {' '.join(params)}, aliases for {' '.join(manifest['devices'])}")
    if have_dkms:
        for entry in dkms.status(package.name, trees):
            if entry.version != package.version and entry.kernel == kernel.release:
                if entry.state == "installed":
                    lines.append(f"keep {entry.name}/{entry.version}: installed for {kernel.release}")
                else:
                    old = dkms.Package(package.name, entry.version)
                    lines.append(f"  {' '.join(dkms.command(dkms.remove_args(old, kernel.release), trees))}")
    return lines


def _planned_source(request: BuildRequest, kernel: Kernel, lines: list[str]) -> Path | None:
    """Say where the source comes from; the tree itself when it is already at hand (to render the plan)."""
    if request.source:
        given = Path(request.source)
        if given.is_dir():
            tree = kernel_source.checked_tree(given)
            if kernel.package_version:
                kernel_source.require_version(tree, kernel.package_version)
            lines.append(f"source {tree} (Linux {kernel_source.kernel_version(tree)})")
            return tree
        lines.append(f"source: fetch and unpack {request.source}" + (f" (sha256 {request.sha256})" if request.sha256 else ""))
        return None
    if not kernel.package_version:
        lines.append("source: unknown until the headers are installed (then the distribution's linux-source)")
        return None
    cached = cache_dir() / "src" / kernel.package_version
    if (cached / kernel_source.ORIGIN_FILE).is_file():
        lines.append(f"source {cached} (cached)")
        return cached
    lines.append(f"source: download linux-source {kernel.package_version} and unpack {AMD_TREE} into {cached}")
    return None
