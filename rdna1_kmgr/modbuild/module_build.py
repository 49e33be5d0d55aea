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
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rdna1_kmgr.core import cache_entry, progress, runner, user_input
from rdna1_kmgr.core.errors import BuildError, HostError, KmgrError
from rdna1_kmgr.core.files import make_dirs, write_atomic
from rdna1_kmgr.core.paths import cache_dir, log_dir
from rdna1_kmgr.core.progress import Progress, count_sources
from rdna1_kmgr.host import host_facts, system_identity
from rdna1_kmgr.host.rdna1_boards import format_id
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.modbuild import compile_probes, module_checks, prerequisites, signing
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild.build_result import BuildResult
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.patch_series import render
from rdna1_kmgr.source import distro_source, kernel_source, verification

AMD_TREE = "drivers/gpu/drm/amd"
# A patch line declaring a module parameter: the series' rdna1_* parameters must be in the module.
_PARAMETER = re.compile(r"^\+.*\bmodule_param(?:_named)?\(\s*(rdna1_\w+)", re.MULTILINE)


def default_jobs() -> int:
    return (os.cpu_count() or 1) + 1


# --- which kernel -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    release: str  # uname -r style: 6.1.0-56-amd64
    package_version: str | None  # the distro's version of that kernel: 6.1.192-2, Ubuntu's 6.8.0-48.48
    note: str | None = None  # said to the user when the release was chosen for them
    upstream: str | None = None  # the Linux version, when the kernel says it (Ubuntu's version_signature)


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


def _current_kernel(system: SystemIdentity) -> str | None:
    """The distribution's current kernel, the way the system's platform record names (none: not known)."""
    finders = {"apt-metapackage": distro_current_kernel}  # by the name in the record (built here: tests patch it)
    finder = finders.get(system.platform.current_kernel or "")
    return finder() if finder is not None and system.on_host else None


def _release_in_depends(text: str) -> str | None:
    m = re.search(r"\blinux-(?:image|headers)-(\d+\.\d+[^\s,()|]*)", text)
    return m.group(1) if m else None


def resolve_kernel(requested: str | None, doing: str = "building", system: SystemIdentity | None = None) -> Kernel:
    """--kernel when given; else the running kernel, or, when that is not the distro's, the distro's current one.
    `doing` is what the command does for it, for the note ("building", "planning an install", ...); `system`
    the one whose facts decide (default: this one)."""
    system = system or system_identity.read()
    if requested is not None:
        release = user_input.kernel_release(requested)
        version, upstream = distro_source.kernel_package(release, system)
        return Kernel(release, version, upstream=upstream)
    running = system.running_release
    version, upstream = distro_source.kernel_package(running, system)
    if version is not None:
        return Kernel(running, version, upstream=upstream)
    current = _current_kernel(system)
    name = system.distro_id or "distribution"
    if current is None:
        raise HostError(
            f"the running kernel {running} is not a {name} kernel " "and no distribution kernel is known",
            "give --kernel RELEASE",
        )
    return Kernel(
        current,
        distro_source.kernel_package(current, system)[0],
        note=f"the running kernel {running} is not a {name} kernel; "
        f"{doing} for the distribution's current kernel {current} (give --kernel to choose)",
    )


def kernel_to_install(requested: str | None, dry_run: bool) -> Kernel:
    """The kernel an install (or its plan) is for, resolved once where the command starts, its note said."""
    kernel = resolve_kernel(requested, "planning an install" if dry_run else "installing")
    if kernel.note:
        progress.say(f"rdna1-kmgr: {kernel.note}")
    return kernel


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


CCACHE_MAX_SIZE = "1.0G"  # ~135 MB a kernel (270 MB measured for 6.1 and 6.12); the owner's max_size wins
# zstd level 8 instead of ccache's 1: amdgpu's cache for one kernel 39.2 MB instead of 41.7 MB (`ccache -X`, 6.1),
# for 1.3 s of CPU over the ~100 MB a cold build writes (a cold build takes 450 s of CPU); above 8, little more.
CCACHE_COMPRESSION_LEVEL = 8


def ccache_dir() -> Path:
    return cache_dir() / "ccache"


def cap_ccache() -> None:
    """The cache's size cap and compression level, written once before the first build uses it: the owner may
    change them there (`ccache -M 2G` with this CCACHE_DIR, or edit the file); a dry run never writes it."""
    conf = ccache_dir() / "ccache.conf"
    if not conf.exists():
        make_dirs(conf.parent)
        settings = f"max_size = {CCACHE_MAX_SIZE}\ncompression_level = {CCACHE_COMPRESSION_LEVEL}\n"
        write_atomic(conf, settings.encode())


def ccache_env() -> dict[str, str]:
    """Route the compiler through ccache when it is installed (install.sh installs it; Debian and Ubuntu put
    its masquerade links in /usr/lib/ccache). rdna1-kbuild compiles in a view where the headers and the kbuild
    tree have the same paths for every kernel release (below the base directory, so ccache keys on them
    relative): a point release's compile finds the last one's object unless what it includes changed."""
    masquerade = Path("/usr/lib/ccache")
    if not shutil.which("ccache") or not masquerade.is_dir():
        return {}
    return {
        "PATH": f"{masquerade}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "CCACHE_DIR": str(ccache_dir()),
        "CCACHE_BASEDIR": str(cache_dir() / "kbuild"),
        "CCACHE_NOHASHDIR": "1",
        # Depend mode: the key is the source and every header the compiler's own dependency file names (kbuild
        # asks for one: -Wp,-MMD), so no compile ever runs the preprocessor twice and a cold build costs about
        # what a plain one does. rdna1-kbuild keeps the build salt out of that key, so a point release hits.
        "CCACHE_DEPEND": "1",
        # Each amdgpu object includes some 1500 headers, the register headers megabytes each, and every lookup
        # hashes all of them: the inode cache hashes a header once per build (by device, inode, size and times).
        "CCACHE_INODECACHE": "1",
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
    stream = stream if stream is not None else progress.current_stream()
    # DKMS has no locking of its own: a second run for the same kernel waits here instead of
    # deleting the first one's build directory under it.
    with cache_left_as_found(), cache_entry.exclusive(dkms.kbuild_root(package.name), kernel):
        return _build_package(
            package,
            kernel,
            source_root,
            subtrees,
            series_dir,
            keys,
            devices,
            parameters,
            jobs,
            description,
            trees,
            stream,
        )


def _build_package(
    package, kernel, source_root, subtrees, series_dir, keys, devices, parameters, jobs, description, trees, stream
) -> PackageBuild:
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
                raise BuildError(
                    f"{package.ref} is installed for {kernel} and fails a check: {err.what}",
                    "roll the install back first (`rdna1-kmgr rollback`), then build again",
                ) from None
            stream.write(f"rdna1-kmgr: rebuilding {package.ref}: the earlier build fails a check ({err.what})\n")
            dkms.remove(package, trees, kernel)
        else:
            removed, kept = _remove_older(package, kernel, trees)
            return PackageBuild(
                package,
                kernel,
                module,
                report,
                keys,
                reused=True,
                compiled=0,
                seconds=time.monotonic() - started,
                log=None,
                removed=removed,
                kept=kept,
            )

    created_source = not package.source_dir(trees).exists()
    log = log_dir() / f"build-{package.name}-{package.version}-{kernel}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    compiler_cache = ccache_env()
    if compiler_cache:
        cap_ccache()
    counter = Progress(
        f"building {package.module.name} for {kernel}", total=_objects_total(source_root, subtrees), stream=stream
    )
    # what is compiled and signed is what was checked: nobody but root can have changed it since
    for subtree in subtrees:
        verification.check_root_only(source_root / subtree)
    verification.check_root_only(series_dir)
    try:
        dkms.assemble(package, source_root, subtrees, series_dir, trees, description)
        dkms.add(package, trees)
        outcome = dkms.build(
            package,
            kernel,
            trees,
            log,
            jobs or default_jobs(),
            env={**compiler_cache, **signing_env(keys)},
            on_line=counter.feed,
            on_tick=counter.tick,
        )
        _check_signed_with(outcome, keys)
        report = checked(outcome.module)
    except BaseException:
        counter.finish("failed")
        _discard(package, kernel, trees, created_source)
        raise
    counter.finish("done")
    removed, kept = _remove_older(package, kernel, trees)
    return PackageBuild(
        package,
        kernel,
        outcome.module,
        report,
        keys,
        reused=False,
        compiled=outcome.compiled,
        seconds=time.monotonic() - started,
        log=outcome.log,
        removed=removed,
        kept=kept,
    )


def _objects_total(source_root: Path, subtrees: list[str]) -> int:
    return sum(count_sources(source_root / sub) for sub in subtrees)


def _check_signed_with(outcome: dkms.BuildOutcome, keys: signing.KeyPair) -> None:
    """DKMS says which key it signed with; a framework.conf setting would override ours."""
    if outcome.certificate is None:
        raise BuildError("DKMS did not sign the module", f"see {outcome.log}")
    if Path(outcome.certificate) != keys.cert:
        raise BuildError(
            f"DKMS signed with {outcome.certificate}, not {keys.cert}",
            "/etc/dkms/framework.conf sets mok_certificate; remove that line or pass it as --key/--cert",
        )


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
    kernel: Kernel  # resolved once, where the command is given (resolve_kernel); nothing below validates it again
    source: str | None = None
    sha256: str | None = None
    keyring: str | None = None  # checks a --source URL's sha256sums.asc (gpgv)
    quirks: list[str] | None = None  # only these (and the default-on quirks the kernel needs); None: all
    devices: list[int] | None = None  # None: every id of the RDNA1 chips found here (devices_for)
    jobs: int | None = None
    yes: bool = False
    no_install: bool = False
    key: str | None = None
    cert: str | None = None
    sysroot: str | None = None  # read the kernel and distribution facts here (--dry-run only)
    debug_info: bool = False  # compile with the kernel config's -g (default: KCFLAGS=-g0)
    without: list[str] | None = None  # quirks left out as asked (--no-quirk)


def devices_for(request: BuildRequest, root: Path = Path("/")) -> tuple[list[int], str | None]:
    """The device ids the build applies its quirks to: --device's, else every id of the chips of the RDNA1
    boards under root (0x731F on a machine without one); and the line naming them (None: given)."""
    if request.devices:
        return sorted(set(request.devices)), None
    found = host_facts.board_devices(root)
    return list(found.ids), found.describe()


def package_for(manifest: Manifest, debug_info: bool) -> dkms.Package:
    """The DKMS package a rendered series goes into."""
    version = dkms.package_version(manifest.kernel_version, manifest.patchset_sha256, debug_info)
    return dkms.Package(dkms.PACKAGE_NAME, version, debug_info=debug_info)


def series_parameters(series_dir: Path) -> list[str]:
    """The rdna1_* module parameters the series adds."""
    found: list[str] = []
    for name in dkms.read_series(series_dir):
        for param in _PARAMETER.findall((series_dir / name).read_text(errors="replace")):
            if param not in found:
                found.append(param)
    return found


def source_tree(request: BuildRequest, kernel: Kernel, system: SystemIdentity) -> tuple[Path, dict]:
    """The driver source of exactly this kernel's version, unpacked in the cache (or the tree given), and
    where it came from."""
    if request.source:
        tree = kernel_source.resolve_source_option(
            request.source, request.sha256, Path(request.keyring) if request.keyring else None
        )
        if kernel.package_version:
            kernel_source.require_version(tree, kernel.upstream or kernel.package_version)
        return tree, {"given": request.source}
    return distro_source.fetch(kernel.release, system)


def run(
    request: BuildRequest,
    confirm: Callable[[prerequisites.InstallPlan], bool] | None = None,
    stream: TextIO | None = None,
) -> BuildResult:
    """Everything `rdna1-kmgr build` does; what it built."""
    stream = stream if stream is not None else progress.current_stream()
    started = time.monotonic()
    system = system_identity.read()
    kernel = request.kernel
    if kernel.note:
        stream.write(f"rdna1-kmgr: {kernel.note}\n")
    keys = signing.resolve(request.key, request.cert, system.platform)
    with cache_left_as_found():
        return _run(request, kernel, system, keys, confirm, stream, started)


def _run(
    request: BuildRequest,
    kernel: Kernel,
    system: SystemIdentity,
    keys: signing.KeyPair,
    confirm,
    stream: TextIO,
    started: float,
) -> BuildResult:
    prerequisites.ensure_prerequisites(kernel.release, yes=request.yes, no_install=request.no_install, confirm=confirm)
    if kernel.package_version is None:  # the headers may have come with the prerequisites
        kernel = Kernel(kernel.release, *distro_source.kernel_package(kernel.release, system)[:1], kernel.note)
    if signing.ensure(keys):
        stream.write(
            f"rdna1-kmgr: made the signing key {keys.key} and certificate {keys.cert}; "
            "enroll it for Secure Boot with `rdna1-kmgr keys enroll`\n"
        )
    tree, origin = source_tree(request, kernel, system)
    devices, found = devices_for(request)
    if found:
        stream.write(f"rdna1-kmgr: {found}\n")

    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-series-") as tmp:
        series = Path(tmp) / "series"
        manifest = render(tree, series, request.quirks, devices, request.without)
        for line in manifest.notes():  # before the long compile: what the build will and will not change
            stream.write(f"rdna1-kmgr: {line}\n")
        # what the driver tree could not show, confirmed against the headers before the long compile
        if compile_probes.confirm(kernel.release, manifest.kernel_names):
            stream.write(
                f"rdna1-kmgr: compile probe: {kernel.release}'s headers define "
                f"{' '.join(sorted(manifest.kernel_names))}\n"
            )
        package = package_for(manifest, request.debug_info)
        devices = [int(d, 16) for d in manifest.devices]
        quirk_ids = manifest.quirk_ids
        built = build_package(
            package,
            kernel.release,
            tree,
            [AMD_TREE],
            series,
            keys,
            devices,
            series_parameters(series),
            jobs=request.jobs,
            description=f"amdgpu of Linux {manifest.kernel_version} with the RDNA1 quirks "
            f"{' '.join(quirk_ids)} for {' '.join(manifest.devices)}",
            stream=stream,
        )
    cert = signing.certificate_info(keys.cert)
    return BuildResult(
        kernel=kernel.release,
        kernel_version=manifest.kernel_version,
        kernel_package_version=kernel.package_version,
        note=kernel.note,
        source=str(tree),
        source_package=origin,
        package=package.name,
        package_version=package.version,
        package_source=str(package.source_dir(dkms.Trees.from_env())),
        module=str(built.module),
        sha256=built.report.sha256,
        vermagic=built.report.vermagic.strip(),
        signer=built.report.signer,
        certificate=str(keys.cert),
        certificate_sha1=cert.sha1_fingerprint,
        signing_key=str(keys.key),
        parameters=tuple(built.report.parameters),
        quirks=tuple(quirk_ids),
        devices=tuple(format_id(d) for d in devices),
        quirks_on=manifest.bits_on,
        quirks_off=tuple(b.id for b in manifest.bits_off),
        patchset_sha256=manifest.patchset_sha256,
        reused=built.reused,
        compiled_objects=built.compiled,
        log=str(built.log) if built.log else None,
        removed_versions=tuple(built.removed),
        kept_installed_versions=tuple(built.kept),
        seconds=round(time.monotonic() - started, 1),
    )
