"""The DKMS package: assemble it under /usr/src, then `dkms add`, `build`, `status` and `remove`.

The package directory mirrors the kernel tree from its root: the pristine driver source at its
kernel path (drivers/gpu/drm/amd/...), the rendered series in patches/, and a dkms.conf whose
PATCH[n] lines make DKMS apply the series itself. Its version encodes the kernel version and the
patch-set hash (6.1.192+p0123456789ab), so a different patch set is a different package version
and the same one is recognised and reused.

The same code packages any out-of-tree module that lives in a kernel-shaped tree (the tests use a
small one), so `ModuleSpec` says which module to build and which make variables it needs.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jinja2

from rdna1_kmgr import __version__
from rdna1_kmgr.core import runner, tool_env
from rdna1_kmgr.core.errors import BuildError, HostError
from rdna1_kmgr.core.files import make_dirs, publish_tree, write_atomic
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.core.progress import is_compiled_object

PACKAGE_NAME = "rdna1-amdgpu"
HOOK_SCRIPT = "rdna1-kbuild"
# A cold amdgpu build is minutes on a desktop; a build still running after this is stuck, not slow.
BUILD_TIMEOUT = 4 * 3600
MANIFEST_NAME = "rdna1-manifest.json"


@dataclass(frozen=True)
class ModuleSpec:
    """One module built from a kernel-shaped tree."""

    name: str  # the .ko's name without suffix
    location: str  # its folder, relative to the tree root (the M= of the build)
    # Make variables naming folders of the tree (relative to its root), e.g. FULL_AMD_PATH.
    make_vars: tuple[tuple[str, str], ...] = ()
    dest_location: str = "/updates/dkms"


# amdgpu outside the kernel tree: its Makefile derives FULL_AMD_PATH from $(srctree), which is the
# headers' tree for an M= build, so it must be given (see KERNEL-NOTES.md).
AMDGPU = ModuleSpec(
    name="amdgpu",
    location="drivers/gpu/drm/amd/amdgpu",
    make_vars=(("FULL_AMD_PATH", "drivers/gpu/drm/amd"),),
)


@dataclass(frozen=True)
class Trees:
    """Where DKMS keeps sources and builds. Tests move both with environment variables."""

    source: Path = Path("/usr/src")
    dkms: Path = Path("/var/lib/dkms")

    @classmethod
    def from_env(cls) -> Trees:
        """The trees, each moved only to a folder that passes the check of the tool's own roots: dkms sources
        what it finds there as bash, and root signs what it builds (core/tool_env.py)."""
        return cls(
            source=tool_env.moved_root(tool_env.DKMS_SOURCE_TREE, "/usr/src"),
            dkms=tool_env.moved_root(tool_env.DKMS_TREE, "/var/lib/dkms"),
        )

    def to_json(self) -> dict[str, str]:
        """As a journal records the trees (an install's begin, dkms-install's undo)."""
        return {"source": str(self.source), "dkms": str(self.dkms)}

    def cli_args(self) -> list[str]:
        # Accepted by DKMS 3.x although its usage text does not list them.
        return [f"--sourcetree={self.source}", f"--dkmstree={self.dkms}"]


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    module: ModuleSpec = AMDGPU
    # Compile with the kernel config's debug info (rdna1-kbuild --debug-info); off: KCFLAGS=-g0.
    debug_info: bool = False

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.version}"

    def source_dir(self, trees: Trees) -> Path:
        return trees.source / f"{self.name}-{self.version}"

    def version_dir(self, trees: Trees) -> Path:
        return trees.dkms / self.name / self.version

    def module_dir(self, trees: Trees, kernel: str) -> Path:
        return self.version_dir(trees) / kernel / os.uname().machine / "module"


def package_version(kernel_version: str, patchset_sha256: str, debug_info: bool = False) -> str:
    """6.1.192 + the patch set's hash -> 6.1.192+p<first 12 hex digits>; +debug when built with debug info
    (another build of the same patch set, so it must not be mistaken for the one without)."""
    if not re.fullmatch(r"[0-9a-f]{12,64}", patchset_sha256):
        raise ValueError(f"not a sha256 hex digest: {patchset_sha256!r}")
    return f"{kernel_version}+p{patchset_sha256[:12]}" + ("+debug" if debug_info else "")


def source_packages(name: str, trees: Trees) -> list[Package]:
    """The versions of `name` whose source stands in the trees' source folder (Package.source_dir's names)."""
    return [
        Package(name, folder.name.removeprefix(f"{name}-"))
        for folder in sorted(trees.source.glob(f"{name}-*"))
        if folder.is_dir()
    ]


def linux_version_of(version: str) -> str:
    """The Linux version a package version was built from (6.1.192+p0123456789ab -> 6.1.192): package_version's
    inverse."""
    return version.split("+p", 1)[0]


def kbuild_root(package_name: str) -> Path:
    """The persistent kbuild trees of a package, one per kernel release below it."""
    return cache_dir() / "kbuild" / package_name


def read_series(series_dir: Path) -> list[str]:
    series = series_dir / "series"
    names = [line.strip() for line in series.read_text().splitlines()]
    return [n for n in names if n and not n.startswith("#")]


def render_conf(package: Package, patches: list[str], description: str) -> str:
    template_text = resources.files("rdna1_kmgr.dkms").joinpath("dkms.conf.j2").read_text()
    env = jinja2.Environment(
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined
    )
    return env.from_string(template_text).render(
        tool_version=__version__,
        description=description,
        name=package.name,
        version=package.version,
        patches=patches,
        kbuild_root=kbuild_root(package.name),
        module_name=package.module.name,
        module_location=package.module.location,
        make_vars=package.module.make_vars,
        dest_module_location=package.module.dest_location,
        debug_info=package.debug_info,
        python=sys.executable,
    )


def assemble(
    package: Package,
    source_root: Path,
    subtrees: list[str],
    series_dir: Path,
    trees: Trees,
    description: str = "",
) -> Path:
    """Write the package directory under the source tree; returns it.

    It is written beside its final place and renamed into it, so an interrupted run never leaves a
    half package that DKMS would pick up. An existing directory is reused, its dkms.conf and hook
    script brought up to date.
    """
    patches = read_series(series_dir)
    conf = render_conf(package, patches, description or f"{package.module.name} for rdna1-kmgr")
    target = package.source_dir(trees)
    hook = resources.files("rdna1_kmgr.dkms").joinpath(HOOK_SCRIPT).read_bytes()
    if target.is_dir() and (target / "dkms.conf").is_file():
        # The version names the source and the series; only what this tool writes around them can differ
        # (a newer rdna1-kmgr): bring those up to date in place.
        _replace_if_changed(target / "dkms.conf", conf.encode(), 0o644)
        _replace_if_changed(target / HOOK_SCRIPT, hook, 0o755)
        return target

    trees.source.mkdir(parents=True, exist_ok=True)
    partial = trees.source / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for sub in subtrees:
            src = source_root / sub
            if not src.is_dir():
                raise BuildError(f"the source has no {sub}/", f"check the source tree {source_root}")
            shutil.copytree(src, partial / sub, symlinks=True, copy_function=_copier(source_root))
        (partial / "patches").mkdir()
        for name in patches:
            shutil.copy2(series_dir / name, partial / "patches" / name)
        (partial / "patches" / "series").write_text("".join(p + "\n" for p in patches))
        if (series_dir / "manifest.json").is_file():
            shutil.copy2(series_dir / "manifest.json", partial / MANIFEST_NAME)
        (partial / HOOK_SCRIPT).write_bytes(hook)
        (partial / HOOK_SCRIPT).chmod(0o755)
        (partial / "dkms.conf").write_text(conf)
        publish_tree(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _replace_if_changed(path: Path, data: bytes, mode: int) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    write_atomic(path, data, mode)


def _copier(source_root: Path):
    """Hard links for a source in our own cache (it is only ever read, and 400 MB need not be written again);
    real copies for a tree of the user's, which an editor may later change in place."""
    try:
        ours = source_root.resolve().is_relative_to(cache_dir().resolve())
    except OSError:
        ours = False
    if not ours:
        return shutil.copy2

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    return link_or_copy


# --- running dkms ---------------------------------------------------------------------------------


def require_dkms() -> None:
    if not shutil.which("dkms"):
        raise HostError("dkms is not installed", "install it (apt install dkms) or let `rdna1-kmgr build` do it")


def command(args: list[str], trees: Trees) -> list[str]:
    """The argument list of one dkms call (also what --dry-run prints)."""
    return ["dkms", *args, *trees.cli_args()]


def add_args(package: Package) -> list[str]:
    return ["add", "-m", package.name, "-v", package.version]


def build_args(package: Package, kernel: str, jobs: int) -> list[str]:
    return ["build", "-m", package.name, "-v", package.version, "-k", kernel, "-j", str(jobs)]


def install_args(package: Package, kernel: str) -> list[str]:
    # --no-depmod: DKMS would run depmod itself, on /lib/modules even with --installtree; install's own depmod
    # step keeps the index change separate and exactly backed up. --force: DKMS otherwise keeps a same-named
    # in-kernel module whose `version:` equals ours (amdgpu has none) and installs nothing, reporting success.
    return ["install", "-m", package.name, "-v", package.version, "-k", kernel, "--force", "--no-depmod"]


def uninstall_args(package: Package, kernel: str) -> list[str]:
    return ["uninstall", "-m", package.name, "-v", package.version, "-k", kernel, "--no-depmod"]


def remove_args(package: Package, kernel: str | None) -> list[str]:
    return ["remove", "-m", package.name, "-v", package.version, *(["-k", kernel] if kernel else ["--all"])]


def _run(args: list[str], trees: Trees, env: dict[str, str] | None = None) -> runner.Result:
    require_dkms()
    return runner.run(command(args, trees), timeout=600, check=False, env=env, error=BuildError)


@dataclass(frozen=True)
class StatusEntry:
    name: str
    version: str
    kernel: str | None  # None while only added
    arch: str | None
    state: str  # added, built, installed (DKMS's words)


_STATUS_LINE = re.compile(
    r"^(?P<name>[^/\s]+)/(?P<version>[^,:\s]+)(?:, (?P<kernel>[^,\s]+), (?P<arch>[^:\s]+))?: (?P<state>[a-z-]+)"
)


def parse_status(text: str) -> list[StatusEntry]:
    """Lines of `dkms status` (3.x: `name/version, kernel, arch: state`, or `name/version: added`)."""
    entries = []
    for line in text.splitlines():
        m = _STATUS_LINE.match(line.strip())
        if m:
            entries.append(StatusEntry(m["name"], m["version"], m["kernel"], m["arch"], m["state"]))
    return entries


def status(name: str, trees: Trees) -> list[StatusEntry]:
    result = _run(["status", "-m", name], trees)
    return parse_status(result.stdout)


def is_built(package: Package, kernel: str, trees: Trees) -> bool:
    return any(
        e.version == package.version and e.kernel == kernel and e.state in ("built", "installed")
        for e in status(package.name, trees)
    )


def is_installed(package: Package, kernel: str, trees: Trees) -> bool:
    return any(
        e.version == package.version and e.kernel == kernel and e.state == "installed"
        for e in status(package.name, trees)
    )


def add(package: Package, trees: Trees) -> None:
    trees.dkms.mkdir(parents=True, exist_ok=True)
    if any(e.version == package.version for e in status(package.name, trees)):
        return
    result = _run(add_args(package), trees)
    if result.returncode != 0:
        raise BuildError(f"dkms add {package.ref} failed: {_last_error(result)}")


def remove(package: Package, trees: Trees, kernel: str | None = None) -> None:
    """Unregister the version (for one kernel, or entirely: then its source directory goes too)."""
    if any(e.version == package.version for e in status(package.name, trees)):
        result = _run(remove_args(package, kernel), trees)
        if result.returncode != 0:
            raise BuildError(f"dkms remove {package.ref} failed: {_last_error(result)}")
    if kernel is None or not any(e.version == package.version for e in status(package.name, trees)):
        shutil.rmtree(package.source_dir(trees), ignore_errors=True)


def _last_error(result: runner.Result) -> str:
    lines = [ln.strip() for ln in (result.stderr + "\n" + result.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "rror" in ln]
    return (errors or lines or [f"exit status {result.returncode}"])[-1]


# --- building ---------------------------------------------------------------------------------------

# gcc/clang diagnostics (`file.c:12:5: error: ...`), then the linker's and modpost's.
_COMPILER_ERROR = re.compile(r"^\S+:\d+(?::\d+)?: (?:fatal )?error: .*")
_OTHER_ERROR = re.compile(r"^(?:ERROR: modpost: .*|.*: undefined reference to .*|.*\*\*\* .*Error \d+.*)$")


def first_compiler_error(log_text: str) -> str | None:
    """The first error a compiler (or, failing that, the linker, modpost or make) reported."""
    lines = log_text.splitlines()
    for pattern in (_COMPILER_ERROR, _OTHER_ERROR):
        for line in lines:
            if pattern.match(line.strip()):
                return line.strip()
    return None


@dataclass
class BuildOutcome:
    module: Path  # the built (stripped, signed) module in the DKMS tree
    signing_key: str | None  # what DKMS says it signed with
    certificate: str | None
    log: Path
    compiled: int  # objects compiled by this build (0 when nothing changed)
    seconds: float


@dataclass
class _LogTail:
    """Follows DKMS's make.log while it grows (DKMS moves it on success; the open file follows)."""

    path: Path
    on_line: Callable[[str], None]
    lines: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        handle = None
        pending = ""
        while True:
            stopping = self._stop.is_set()
            if handle is None:
                try:
                    handle = open(self.path, errors="replace")
                except FileNotFoundError:
                    handle = None
            if handle is not None:
                chunk = handle.read()
                if chunk:
                    pending += chunk
                    *complete, pending = pending.split("\n")
                    for line in complete:
                        self.lines.append(line)
                        self.on_line(line)
            if stopping:
                break
            time.sleep(0.25)
        if pending:
            self.lines.append(pending)
            self.on_line(pending)
        if handle is not None:
            handle.close()

    def stop(self) -> None:
        self._stop.set()


def build(
    package: Package,
    kernel: str,
    trees: Trees,
    log_path: Path,
    jobs: int,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] = lambda line: None,
    on_tick: Callable[[], None] = lambda: None,
) -> BuildOutcome:
    """`dkms build` the (added) package for `kernel`; the whole log goes to `log_path`.

    `on_line` sees each line of the make output as it is written (for progress). A failure raises
    BuildError naming the first compiler error (or the patch that did not apply) and the log.
    """
    started = time.monotonic()
    make_log = package.version_dir(trees) / "build" / "make.log"
    make_log.unlink(missing_ok=True)
    compiled = 0

    def count(line: str) -> None:
        nonlocal compiled
        if is_compiled_object(line):
            compiled += 1
        on_line(line)

    tail = _LogTail(make_log, count)
    follower = threading.Thread(target=tail.run, daemon=True)
    follower.start()
    require_dkms()
    try:
        result = runner.run(
            command(build_args(package, kernel, jobs), trees),
            timeout=BUILD_TIMEOUT,
            check=False,
            merge_stderr=True,
            env=env,
            on_tick=on_tick,
            error=BuildError,
        )
    finally:
        tail.stop()
        follower.join()
    dkms_output = result.stdout

    make_dirs(log_path.parent)  # 0700 under the log root
    text = (
        f"# rdna1-kmgr: dkms build {package.ref} for {kernel}, exit status {result.returncode}\n"
        + dkms_output
        + "\n# make.log\n"
        + "\n".join(tail.lines)
        + "\n"
    )
    write_atomic(log_path, text.encode(errors="replace"), 0o600)  # root's log, never through a link
    if result.returncode != 0:
        raise _build_failure(dkms_output, "\n".join(tail.lines), log_path, result.returncode)

    module = built_module(package, kernel, trees)
    return BuildOutcome(
        module=module,
        signing_key=_reported(dkms_output, "Signing key"),
        certificate=_reported(dkms_output, "Public certificate (MOK)"),
        log=log_path,
        compiled=compiled,
        seconds=time.monotonic() - started,
    )


def _reported(dkms_output: str, label: str) -> str | None:
    m = re.search(rf"^{re.escape(label)}: (.+)$", dkms_output, re.MULTILINE)
    return m.group(1).strip() if m else None


def _build_failure(dkms_output: str, make_log: str, log_path: Path, status_code: int) -> BuildError:
    patch = re.search(r"Application of patch (\S+) failed", dkms_output)
    if patch:
        # patch's own words: DKMS 3.0 lets them through to its output, DKMS 3.1+ (Debian 13's 3.2) writes them
        # only to make.log, beside its header and each step's `# command:` lines.
        said = (dkms_output + "\n" + make_log).splitlines()
        hunk = next((ln.strip() for ln in said if "FAILED" in ln or "malformed" in ln), "")
        detail = f" ({hunk})" if hunk else ""
        return BuildError(
            f"patch {patch.group(1)} does not apply to the source{detail}",
            f"the series does not fit this source; whole log: {log_path}",
        )
    first = first_compiler_error(make_log)
    if first:
        return BuildError(f"compile error: {first}", f"whole log: {log_path}")
    lines = [ln.strip() for ln in dkms_output.splitlines() if ln.strip()]
    reason = next((ln for ln in reversed(lines) if "rror" in ln), lines[-1] if lines else "")
    return BuildError(f"dkms build failed (exit status {status_code}): {reason}", f"whole log: {log_path}")


def built_module(package: Package, kernel: str, trees: Trees) -> Path:
    """The module a finished build left in the DKMS tree (DKMS compresses it when the kernel does)."""
    folder = package.module_dir(trees, kernel)
    for suffix in (".ko", ".ko.xz", ".ko.zst", ".ko.gz"):
        candidate = folder / f"{package.module.name}{suffix}"
        if candidate.is_file():
            return candidate
    raise BuildError(f"dkms reported success but {folder} holds no {package.module.name}.ko")
