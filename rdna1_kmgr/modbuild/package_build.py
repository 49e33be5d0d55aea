"""The package half of a build: any DKMS package of a kernel-shaped tree and a series in, built, signed and
verified for one kernel out (or reused when built already), older versions for that kernel dropped.

It knows nothing about amdgpu, which is how the tests drive it with a tiny module; module_build's stages feed it.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import cache_entry, progress
from rdna1_kmgr.core.errors import BuildError, KmgrError
from rdna1_kmgr.core.files import make_dirs, write_atomic
from rdna1_kmgr.core.paths import cache_dir, log_dir
from rdna1_kmgr.core.progress import Progress, count_sources
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_checks, signing
from rdna1_kmgr.source import verification


def default_jobs() -> int:
    return (os.cpu_count() or 1) + 1


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
) -> PackageBuild:
    """Build (or reuse) one package version for one kernel, verified; on failure nothing of it is left."""
    trees = trees or dkms.Trees.from_env()
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
        )


def _build_package(
    package, kernel, source_root, subtrees, series_dir, keys, devices, parameters, jobs, description, trees
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
            progress.say(f"rdna1-kmgr: rebuilding {package.ref}: the earlier build fails a check ({err.what})")
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
    counter = Progress(f"building {package.module.name} for {kernel}", total=_objects_total(source_root, subtrees))
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
