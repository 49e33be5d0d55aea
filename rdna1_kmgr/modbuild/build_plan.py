"""`rdna1-kmgr build --dry-run`: what a build would do, step by step, with its exact commands.

Nothing on the system changes. The kernel's source is fetched and unpacked into the cache as a build would
(the cache is no part of the system; a dry run that cannot name the source it renders proves little), the
series is rendered into a scratch folder and applied to a copy of the files it changes. With a sysroot the
kernel and distribution facts come from there (a mounted system, or a test's Ubuntu-shaped tree); the
prerequisites are then listed, not checked, since the host's dpkg is not the sysroot's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rdna1_kmgr.core import user_input
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.host.rdna1_boards import format_id
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.modbuild import compile_probes, prerequisites, signing
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild.module_build import (
    AMD_TREE,
    BuildRequest,
    Kernel,
    ccache_env,
    default_jobs,
    devices_for,
    package_for,
    series_parameters,
    source_tree,
)
from rdna1_kmgr.render.patch_series import render
from rdna1_kmgr.render.series_apply import check_applies
from rdna1_kmgr.source import kernel_source


def plan(request: BuildRequest) -> dict:
    """{"plan": the steps as lines, "kernel", "source", "signing", "render", "system"}."""
    root = user_input.existing_dir(request.sysroot, "sysroot") if request.sysroot else Path("/")
    system = system_identity.read(root)
    kernel = request.kernel
    keys = signing.resolve(request.key, request.cert, system.platform)
    trees = dkms.Trees.from_env()
    jobs = request.jobs or default_jobs()
    lines = [f"note: {kernel.note}"] if kernel.note else []
    lines.append(
        f"kernel {kernel.release}"
        + (f" (package {kernel.package_version})" if kernel.package_version else "")
        + (f", Linux {kernel.upstream}" if kernel.upstream else "")
    )
    devices, found = devices_for(request, root)
    lines.append(found or f"devices {' '.join(format_id(d) for d in devices)} (as given)")
    first_note = len(lines)  # what the render decides goes here, before the steps that do the work
    lines += _prerequisites(kernel, system, request)

    tree, origin = _source(request, kernel, system, lines)

    key_file = keys.key if keys.convention == "given" else system.path(keys.key)
    cert_file = keys.cert if keys.convention == "given" else system.path(keys.cert)
    if key_file.exists() or cert_file.exists():
        lines.append(f"sign with {keys.key} and {keys.cert} ({keys.convention})")
    else:
        lines.append(f"generate the signing key {keys.key} (mode 0600) and certificate {keys.cert} ({keys.convention})")
    result = {
        "system": system.to_json(),
        "plan": lines,
        "signing": {**keys.to_json(), "exists": key_file.exists()},
        "kernel": {"release": kernel.release, "package_version": kernel.package_version, "upstream": kernel.upstream},
        "source": {**origin, "tree": str(tree) if tree else None},
        "render": None,
        "devices": [format_id(d) for d in devices],
    }

    if tree is None:
        lines.append(
            f"render the series; package {dkms.PACKAGE_NAME}-<kernel version>+p<patch-set hash> "
            f"under {trees.source}"
        )
        lines.append(f"  {' '.join(dkms.command(['add', '-m', dkms.PACKAGE_NAME, '-v', '<version>'], trees))}")
        build = ["build", "-m", dkms.PACKAGE_NAME, "-v", "<version>", "-k", kernel.release, "-j", str(jobs)]
        lines.append(f"  {' '.join(dkms.command(build, trees))}")
        return result

    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-series-") as tmp:
        manifest = render(tree, Path(tmp) / "series", request.quirks, devices, request.without)
        params = series_parameters(Path(tmp) / "series")
        touched = check_applies(tree, Path(tmp) / "series")
    package = package_for(manifest, request.debug_info)
    lines[first_note:first_note] = manifest.notes()
    result["render"] = {
        "kernel_version": manifest.kernel_version,
        "patches": len(manifest.patches),
        "patchset_sha256": manifest.patchset_sha256,
        "devices": list(manifest.devices),
        "quirks_on": list(manifest.bits_on),
        "quirks_off": [b.id for b in manifest.bits_off],
        "applies": True,
        "files": touched,
        "package": package.ref,
    }
    lines.append(
        f"render {len(manifest.patches)} patches (patch set {manifest.patchset_sha256[:12]}) "
        f"for devices {' '.join(manifest.devices)}; they apply with patch -p1 ({len(touched)} files)"
    )
    if manifest.kernel_names and system.on_host:
        lines.append(
            f"compile probe against {compile_probes.headers_dir(kernel.release)}: "
            f"{' '.join(sorted(manifest.kernel_names))} defined"
        )
    lines += _dkms_steps(package, kernel, trees, jobs, system, request.debug_info)
    lines.append(
        f"verify vermagic {kernel.release}, the signature against {keys.cert} (openssl), "
        f"parameters {' '.join(params)}, aliases for {' '.join(manifest.devices)}"
    )
    return result


def _prerequisites(kernel: Kernel, system: SystemIdentity, request: BuildRequest) -> list[str]:
    manager = prerequisites.manager_for(system.platform, system.codename)
    if not system.on_host:
        return [
            f"prerequisites: not checked (sysroot {system.sysroot}); {manager.name} must have "
            f"{' '.join(manager.required(kernel.release))}"
        ]
    install = manager.plan(kernel.release)
    if install.empty:
        return ["prerequisites: all installed"]
    verb = "missing (--no-install: stop here)" if request.no_install else "install"
    return [f"prerequisites {verb}: {' '.join(install.missing)}"] + [f"  {step}" for step in install.describe()]


def _source(
    request: BuildRequest, kernel: Kernel, system: SystemIdentity, lines: list[str]
) -> tuple[Path | None, dict]:
    """The tree to render, fetched into the cache as a build would; None when it cannot be known yet."""
    if not request.source and not kernel.package_version:
        lines.append("source: unknown until the headers are installed (then the distribution's linux-source)")
        return None, {}
    tree, origin = source_tree(request, kernel, system)
    what = f"{origin['package']} {origin['version']}" if origin.get("package") else request.source or "the given tree"
    lines.append(
        f"source {tree} (Linux {kernel_source.kernel_version(tree)}, from {what}"
        + (f", {origin['suite']}" if origin.get("suite") else "")
        + ")"
    )
    return tree, origin


def _dkms_steps(
    package: dkms.Package, kernel: Kernel, trees: dkms.Trees, jobs: int, system: SystemIdentity, debug_info: bool
) -> list[str]:
    have_dkms = system.on_host and shutil.which("dkms") is not None
    if have_dkms and dkms.is_built(package, kernel.release, trees):
        return [f"reuse {package.ref}, already built for {kernel.release} (verified again)"]
    lines = [
        f"write {package.source_dir(trees)}/ ({AMD_TREE}, patches/, dkms.conf)",
        f"  {' '.join(dkms.command(dkms.add_args(package), trees))}",
        f"  {' '.join(dkms.command(dkms.build_args(package, kernel.release, jobs), trees))}"
        f"   (kbuild tree {dkms.kbuild_root(package.name) / kernel.release}{', ccache' if ccache_env() else ''}"
        f"{', with debug info' if debug_info else ', no debug info unless module BTF needs it'})",
    ]
    if have_dkms:
        for entry in dkms.status(package.name, trees):
            if entry.version != package.version and entry.kernel == kernel.release:
                if entry.state == "installed":
                    lines.append(f"keep {entry.name}/{entry.version}: installed for {kernel.release}")
                else:
                    old = dkms.Package(package.name, entry.version)
                    lines.append(f"  {' '.join(dkms.command(dkms.remove_args(old, kernel.release), trees))}")
    return lines
