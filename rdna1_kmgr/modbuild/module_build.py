"""`rdna1-kmgr build`: a kernel release in, a patched, signed, verified amdgpu.ko out (through DKMS).

The build is one pipeline (core/pipeline.py) of stages, each saying what it would do and doing it, so
`build --dry-run` is this list planned and the build is this list run:

    kernel         which kernel and which devices (resolved at the command edge; said here)
    prerequisites  headers, dkms, tools (installed when allowed); the kernel's package version once known
    fetch          the kernel's exact driver source, unpacked in the cache (or the tree given)
    signing key    the key and certificate the module is signed with (made when missing)
    render         the series for that source, the quirks and devices asked
    probe          what the driver tree could not show, confirmed against the headers before the long compile
    dkms build     the DKMS package written, added, built and verified (package_build); older versions dropped
    verify         what was built and checked, as the build's result

A dry run changes nothing on the system: the source is fetched into the cache as a build would (the cache is no
part of the system; a dry run that cannot name the source it renders proves little), the series is rendered into
a scratch folder and applied to a copy of the files it changes. With a sysroot the kernel and distribution facts
come from there; the prerequisites are then listed, not checked, since the host's dpkg is not the sysroot's.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import progress, user_input
from rdna1_kmgr.core.pipeline import Pipeline
from rdna1_kmgr.host import host_facts, system_identity
from rdna1_kmgr.host.rdna1_boards import format_id
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.modbuild import compile_probes, prerequisites, signing
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild.build_result import BuildPlan, BuildResult, RenderPlan
from rdna1_kmgr.modbuild.package_build import PackageBuild, build_package, cache_left_as_found, ccache_env, default_jobs
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.patch_series import render
from rdna1_kmgr.render.series_apply import check_applies
from rdna1_kmgr.source import distro_source, kernel_source
from rdna1_kmgr.source.target_kernel import Kernel

AMD_TREE = "drivers/gpu/drm/amd"
# A patch line declaring a module parameter: the series' rdna1_* parameters must be in the module.
_PARAMETER = re.compile(r"^\+.*\bmodule_param(?:_named)?\(\s*(rdna1_\w+)", re.MULTILINE)


@dataclass
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
    version = dkms.package_version(*manifest.rendered(), debug_info)
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


# --- the stages ------------------------------------------------------------------------------------------


@dataclass
class BuildContext:
    """What the build's stages read and fill, in stage order."""

    request: BuildRequest
    system: SystemIdentity
    kernel: Kernel
    keys: signing.KeyPair
    scratch: Path  # the series is rendered below it
    root: Path = Path("/")  # the system whose boards choose the devices (a dry run's sysroot)
    confirm: Callable[[prerequisites.InstallPlan], bool] | None = None
    started: float = field(default_factory=time.monotonic)
    trees: dkms.Trees = field(default_factory=dkms.Trees.from_env)
    devices: list[int] = field(default_factory=list)
    devices_found: str | None = None  # the line naming the boards' devices (None: given)
    tree: Path | None = None  # the driver source (None in a plan: not known until the headers are installed)
    origin: dict = field(default_factory=dict)
    key_exists: bool = False
    manifest: Manifest | None = None
    notes: list[str] = field(default_factory=list)  # what the render decided, said before the work
    applies_to: list[str] = field(default_factory=list)  # the files the series changes (a plan's check)
    package: dkms.Package | None = None
    built: PackageBuild | None = None
    result: BuildResult | None = None

    @property
    def series(self) -> Path:
        return self.scratch / "series"

    @property
    def jobs(self) -> int:
        return self.request.jobs or default_jobs()


class KernelStage:
    name = "kernel"

    def plan(self, ctx: BuildContext) -> list[str]:
        kernel = ctx.kernel
        lines = [f"note: {kernel.note}"] if kernel.note else []
        lines.append(
            f"kernel {kernel.release}"
            + (f" (package {kernel.package_version})" if kernel.package_version else "")
            + (f", Linux {kernel.upstream}" if kernel.upstream else "")
        )
        ctx.devices, ctx.devices_found = devices_for(ctx.request, ctx.root)
        lines.append(ctx.devices_found or f"devices {' '.join(format_id(d) for d in ctx.devices)} (as given)")
        return lines

    def run(self, ctx: BuildContext) -> None:
        if ctx.kernel.note:
            progress.say(f"rdna1-kmgr: {ctx.kernel.note}")
        ctx.devices, ctx.devices_found = devices_for(ctx.request, ctx.root)
        if ctx.devices_found:
            progress.say(f"rdna1-kmgr: {ctx.devices_found}")


class PrerequisitesStage:
    name = "prerequisites"

    def plan(self, ctx: BuildContext) -> list[str]:
        kernel, system = ctx.kernel, ctx.system
        manager = prerequisites.manager_for(system.platform, system.codename)
        if not system.on_host:
            return [
                f"prerequisites: not checked (sysroot {system.sysroot}); {manager.name} must have "
                f"{' '.join(manager.required(kernel.release))}"
            ]
        install = manager.plan(kernel.release)
        if install.empty:
            return ["prerequisites: all installed"]
        verb = "missing (--no-install: stop here)" if ctx.request.no_install else "install"
        return [f"prerequisites {verb}: {' '.join(install.missing)}"] + [f"  {step}" for step in install.describe()]

    def run(self, ctx: BuildContext) -> None:
        request, kernel = ctx.request, ctx.kernel
        prerequisites.ensure_prerequisites(
            kernel.release, yes=request.yes, no_install=request.no_install, confirm=ctx.confirm
        )
        if kernel.package_version is None:  # the headers may have come with the prerequisites
            version, upstream = distro_source.kernel_package(kernel.release, ctx.system)
            ctx.kernel = Kernel(kernel.release, version, kernel.note, upstream)


class FetchStage:
    name = "fetch"

    def plan(self, ctx: BuildContext) -> list[str]:
        request, kernel = ctx.request, ctx.kernel
        if not request.source and not kernel.package_version:
            return ["source: unknown until the headers are installed (then the distribution's linux-source)"]
        ctx.tree, ctx.origin = source_tree(request, kernel, ctx.system)
        origin = ctx.origin
        what = (
            f"{origin['package']} {origin['version']}" if origin.get("package") else request.source or "the given tree"
        )
        return [
            f"source {ctx.tree} (Linux {kernel_source.kernel_version(ctx.tree)}, from {what}"
            + (f", {origin['suite']}" if origin.get("suite") else "")
            + ")"
        ]

    def run(self, ctx: BuildContext) -> None:
        ctx.tree, ctx.origin = source_tree(ctx.request, ctx.kernel, ctx.system)
        progress.say(f"rdna1-kmgr: source {ctx.tree}")


class SigningKeyStage:
    name = "signing key"

    def plan(self, ctx: BuildContext) -> list[str]:
        keys, system = ctx.keys, ctx.system
        key_file = keys.key if keys.convention == "given" else system.path(keys.key)
        cert_file = keys.cert if keys.convention == "given" else system.path(keys.cert)
        ctx.key_exists = key_file.exists()
        if key_file.exists() or cert_file.exists():
            return [f"sign with {keys.key} and {keys.cert} ({keys.convention})"]
        return [f"generate the signing key {keys.key} (mode 0600) and certificate {keys.cert} ({keys.convention})"]

    def run(self, ctx: BuildContext) -> None:
        if signing.ensure(ctx.keys):
            progress.say(
                f"rdna1-kmgr: made the signing key {ctx.keys.key} and certificate {ctx.keys.cert}; "
                "enroll it for Secure Boot with `rdna1-kmgr keys enroll`"
            )


class RenderStage:
    name = "render"

    def plan(self, ctx: BuildContext) -> list[str]:
        if ctx.tree is None:
            return [
                f"render the series; package {dkms.PACKAGE_NAME}-<kernel version>+p<patch-set hash> "
                f"under {ctx.trees.source}"
            ]
        self._render(ctx)
        assert ctx.manifest is not None
        ctx.applies_to = check_applies(ctx.tree, ctx.series)
        ctx.notes = ctx.manifest.notes()
        return [
            f"render {len(ctx.manifest.patches)} patches (patch set {ctx.manifest.rendered()[1][:12]}) "
            f"for devices {' '.join(ctx.manifest.devices)}; they apply with patch -p1 ({len(ctx.applies_to)} files)"
        ]

    def run(self, ctx: BuildContext) -> None:
        self._render(ctx)
        assert ctx.manifest is not None
        progress.say(
            f"rdna1-kmgr: rendered {len(ctx.manifest.patches)} patches "
            f"(patch set {ctx.manifest.rendered()[1][:12]})"
        )
        for line in ctx.manifest.notes():  # before the long compile: what the build will and will not change
            progress.say(f"rdna1-kmgr: {line}")

    @staticmethod
    def _render(ctx: BuildContext) -> None:
        assert ctx.tree is not None
        request = ctx.request
        ctx.manifest = render(ctx.tree, ctx.series, request.quirks, ctx.devices, request.without)
        ctx.package = package_for(ctx.manifest, request.debug_info)


class ProbeStage:
    name = "probe"

    def plan(self, ctx: BuildContext) -> list[str]:
        if ctx.manifest is None or not ctx.manifest.kernel_names or not ctx.system.on_host:
            return []
        return [
            f"compile probe against {compile_probes.headers_dir(ctx.kernel.release)}: "
            f"{' '.join(sorted(ctx.manifest.kernel_names))} defined"
        ]

    def run(self, ctx: BuildContext) -> None:
        assert ctx.manifest is not None
        if compile_probes.confirm(ctx.kernel.release, ctx.manifest.kernel_names):
            progress.say(
                f"rdna1-kmgr: compile probe: {ctx.kernel.release}'s headers define "
                f"{' '.join(sorted(ctx.manifest.kernel_names))}"
            )


class DkmsBuildStage:
    name = "dkms build"

    def plan(self, ctx: BuildContext) -> list[str]:
        kernel, trees, package = ctx.kernel.release, ctx.trees, ctx.package
        if package is None:  # the source is not known yet: the commands, with the version to come
            build = ["build", "-m", dkms.PACKAGE_NAME, "-v", "<version>", "-k", kernel, "-j", str(ctx.jobs)]
            return [
                f"  {' '.join(dkms.command(['add', '-m', dkms.PACKAGE_NAME, '-v', '<version>'], trees))}",
                f"  {' '.join(dkms.command(build, trees))}",
            ]
        have_dkms = ctx.system.on_host and shutil.which("dkms") is not None
        if have_dkms and dkms.is_built(package, kernel, trees):
            return [f"reuse {package.ref}, already built for {kernel} (verified again)"]
        lines = [
            f"write {package.source_dir(trees)}/ ({AMD_TREE}, patches/, dkms.conf)",
            f"  {' '.join(dkms.command(dkms.add_args(package), trees))}",
            f"  {' '.join(dkms.command(dkms.build_args(package, kernel, ctx.jobs), trees))}"
            f"   (kbuild tree {dkms.kbuild_root(package.name) / kernel}{', ccache' if ccache_env() else ''}"
            f"{', with debug info' if ctx.request.debug_info else ', no debug info unless module BTF needs it'})",
        ]
        if have_dkms:
            for entry in dkms.status(package.name, trees):
                if entry.version != package.version and entry.kernel == kernel:
                    if entry.state == "installed":
                        lines.append(f"keep {entry.name}/{entry.version}: installed for {kernel}")
                    else:
                        old = dkms.Package(package.name, entry.version)
                        lines.append(f"  {' '.join(dkms.command(dkms.remove_args(old, kernel), trees))}")
        return lines

    def run(self, ctx: BuildContext) -> None:
        assert ctx.manifest is not None and ctx.package is not None and ctx.tree is not None
        manifest = ctx.manifest
        ctx.built = build_package(
            ctx.package,
            ctx.kernel.release,
            ctx.tree,
            [AMD_TREE],
            ctx.series,
            ctx.keys,
            [int(d, 16) for d in manifest.devices],
            series_parameters(ctx.series),
            jobs=ctx.request.jobs,
            description=f"amdgpu of Linux {manifest.kernel_version} with the RDNA1 quirks "
            f"{' '.join(manifest.quirk_ids)} for {' '.join(manifest.devices)}",
        )


class VerifyStage:
    """The module is checked (vermagic, signature, parameters, aliases) inside build_package, under the build's
    lock, since whether an earlier build is reused depends on it; this stage plans that check and records it."""

    name = "verify"

    def plan(self, ctx: BuildContext) -> list[str]:
        if ctx.manifest is None:
            return []
        return [
            f"verify vermagic {ctx.kernel.release}, the signature against {ctx.keys.cert} (openssl), "
            f"parameters {' '.join(series_parameters(ctx.series))}, aliases for {' '.join(ctx.manifest.devices)}"
        ]

    def run(self, ctx: BuildContext) -> None:
        manifest, package, built, kernel, keys = ctx.manifest, ctx.package, ctx.built, ctx.kernel, ctx.keys
        assert manifest is not None and package is not None and built is not None and ctx.tree is not None
        cert = signing.certificate_info(keys.cert)
        kernel_version, patchset = manifest.rendered()
        ctx.result = BuildResult(
            kernel=kernel.release,
            kernel_version=kernel_version,
            kernel_package_version=kernel.package_version,
            note=kernel.note,
            source=str(ctx.tree),
            source_package=ctx.origin,
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
            quirks=tuple(manifest.quirk_ids),
            devices=tuple(format_id(int(d, 16)) for d in manifest.devices),
            quirks_on=manifest.bits_on,
            quirks_off=tuple(b.id for b in manifest.bits_off),
            patchset_sha256=patchset,
            reused=built.reused,
            compiled_objects=built.compiled,
            log=str(built.log) if built.log else None,
            removed_versions=tuple(built.removed),
            kept_installed_versions=tuple(built.kept),
            seconds=round(time.monotonic() - ctx.started, 1),
        )
        progress.say(f"rdna1-kmgr: {'reused' if built.reused else 'built'} {package.ref}: {built.module}")


KERNEL, PREREQUISITES, FETCH, SIGNING_KEY = KernelStage(), PrerequisitesStage(), FetchStage(), SigningKeyStage()
RENDER, PROBE, DKMS_BUILD, VERIFY = RenderStage(), ProbeStage(), DkmsBuildStage(), VerifyStage()
BUILD = Pipeline((KERNEL, PREREQUISITES, FETCH, SIGNING_KEY, RENDER, PROBE, DKMS_BUILD, VERIFY))


# --- the build and its plan ----------------------------------------------------------------------------


def plan(request: BuildRequest, pipeline: Pipeline = BUILD) -> BuildPlan:
    """The build's stages (or a pipeline made of them and more: follow's) planned: the steps as lines and what
    they decided. What the render decides is said right after the kernel and devices, before the steps that do
    the work."""
    root = user_input.existing_dir(request.sysroot, "sysroot") if request.sysroot else Path("/")
    system = system_identity.read(root)
    keys = signing.resolve(request.key, request.cert, system.platform)
    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-series-") as tmp:
        ctx = BuildContext(request, system, request.kernel, keys, Path(tmp), root=root)
        planned = [(stage.name, stage.plan(ctx)) for stage in pipeline.stages]
    lines: list[str] = []
    for name, stage_lines in planned:
        lines += stage_lines + (ctx.notes if name == KERNEL.name else [])
    manifest, package = ctx.manifest, ctx.package
    rendered = None
    if manifest is not None and package is not None:
        kernel_version, patchset = manifest.rendered()
        rendered = RenderPlan(
            kernel_version=kernel_version,
            patches=len(manifest.patches),
            patchset_sha256=patchset,
            devices=tuple(manifest.devices),
            quirks_on=tuple(manifest.bits_on),
            quirks_off=tuple(b.id for b in manifest.bits_off),
            applies=True,
            files=tuple(ctx.applies_to),
            package=package.ref,
        )
    return BuildPlan(
        system=system,
        plan=tuple(lines),
        keys=keys,
        key_exists=ctx.key_exists,
        kernel=ctx.kernel,
        origin=ctx.origin,
        tree=ctx.tree,
        render=rendered,
        devices=tuple(format_id(d) for d in ctx.devices),
    )


def run(request: BuildRequest, confirm: Callable[[prerequisites.InstallPlan], bool] | None = None) -> BuildResult:
    """Everything `rdna1-kmgr build` does: the build's stages run; what it built. Its lines go to progress."""
    started = time.monotonic()
    system = system_identity.read()
    keys = signing.resolve(request.key, request.cert, system.platform)
    with cache_left_as_found(), tempfile.TemporaryDirectory(prefix="rdna1-kmgr-series-") as tmp:
        ctx = BuildContext(request, system, request.kernel, keys, Path(tmp), confirm=confirm, started=started)
        BUILD.run(ctx)
    assert ctx.result is not None
    return ctx.result
