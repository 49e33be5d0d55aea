"""ROCm's versions on this machine (AMD's /opt/rocm-* trees, the distribution's packages) against the kernel.

Two ROCm stacks side by side is the usual source of a library of one version loading another's runtime;
which one a program gets depends on LD_LIBRARY_PATH and ld.so.conf. Stacks are counted as an owner counts them:
AMD's packages and the /opt/rocm-X.Y.Z tree they install are one (dpkg's file list says where a package's
files went; AMD's versions also carry the release, 6.4.43484.60401 for 6.4.1), the distribution's own
packages another, and a ROCm carried inside a Python environment (TheRock's rocm-sdk wheels, a torch wheel's
own torch/lib) one of its own: that one is loaded by its PyTorch, and mixes with a system stack only when the
system's libraries come first (LD_LIBRARY_PATH: see mixed-stacks). The kernel's KFD is what every ROCm
release talks to; AMD's own amdgpu-dkms replaces it with an out-of-tree driver of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.modbuild.dkms_package import PACKAGE_NAME
from rdna1_kmgr.source.debian_archive import parse_record

# Debian/Ubuntu packages that make up a ROCm stack (the HIP runtime and the libraries doctor reads).
ROCM_PACKAGES = re.compile(
    r"^(libamdhip64-\d+|librocblas\d+|libmiopen\d*|libhipblaslt\d+|libhsa-runtime64-\d+|"
    r"rocminfo|rocm-core|hip-runtime-amd|rocblas|miopen-hip|hipblaslt|amdgpu-dkms)$"
)


def installed_packages(sysroot: Path) -> dict[str, str]:
    """ROCm packages dpkg lists installed: name -> version."""
    try:
        text = (sysroot / "var/lib/dpkg/status").read_text(errors="replace")
    except OSError:
        return {}
    found = {}
    for stanza in text.split("\n\n"):
        record = parse_record(stanza)
        if ROCM_PACKAGES.match(record.get("Package", "")) and record.get("Status", "").endswith(" installed"):
            found[record["Package"]] = record.get("Version", "?")
    return found


def opt_rocm(sysroot: Path) -> dict[str, str]:
    """AMD's trees: /opt/rocm-6.2.4 -> its .info/version."""
    found = {}
    for tree in sorted(sysroot.glob("opt/rocm*")):
        if tree.is_symlink() or not tree.is_dir():
            continue
        try:
            found[str(Path("/") / tree.relative_to(sysroot))] = (tree / ".info/version").read_text().strip()
        except OSError:
            found[str(Path("/") / tree.relative_to(sysroot))] = "?"
    return found


def tree_of(sysroot: Path, package: str, version: str, trees: dict[str, str]) -> str | None:
    """The /opt/rocm-X.Y.Z tree a package installed into, or None (a distribution package)."""
    info = sysroot / "var/lib/dpkg/info"
    lists = [info / f"{package}.list", info / f"{package}:amd64.list"]
    listed = next((p.read_text(errors="replace") for p in lists if p.is_file()), "")
    for tree, release in trees.items():
        if f"{tree}/" in listed:
            return tree
        parts = release.split("-")[0].split(".")
        if len(parts) >= 3 and all(p.isdigit() for p in parts[:3]):
            code = f"{int(parts[0])}{int(parts[1]):02d}{int(parts[2]):02d}"
            if re.search(rf"(?<![0-9]){code}(?![0-9])", version):
                return tree
    return None


def findings(sysroot: Path, kernel: str, wheels: Sequence[str] = ()) -> list[Finding]:
    """`wheels`: each ROCm carried in a Python environment (TheRock's rocm-sdk-core, a torch wheel's own), said
    with its version and where."""
    packages = installed_packages(sysroot)
    trees = opt_rocm(sysroot)
    out_of_tree = sorted(
        str(p.relative_to(sysroot)) for p in sysroot.glob(f"lib/modules/{kernel}/updates/dkms/amdgpu.ko*")
    )
    facts = {
        "kernel": kernel,
        "packages": packages,
        "opt_rocm": trees,
        "python_wheels": list(wheels),
        "updates_amdgpu": out_of_tree,
    }
    hip = {k: v for k, v in packages.items() if k.startswith(("libamdhip64", "hip-runtime-amd"))}
    owned = {k: tree_of(sysroot, k, v, trees) for k, v in hip.items()}
    stacks = [
        f"{path} {version}" + "".join(f" (package {k} {hip[k]})" for k, t in sorted(owned.items()) if t == path)
        for path, version in trees.items()
    ]
    distribution = {k: v for k, v in sorted(hip.items()) if owned[k] is None}
    if distribution:
        stacks.append("distribution " + " ".join(f"{k} {v}" for k, v in distribution.items()))
    result = []
    if not stacks and wheels:
        result.append(
            Finding(
                "versions",
                "info",
                f"ROCm: no system-wide stack; {'; '.join(wheels)} (Python wheels) with kernel {kernel}",
                "the wheels bring their own ROCm runtime and libraries, loaded by the PyTorch beside them",
                "",
                facts,
            )
        )
    elif not stacks:
        result.append(
            Finding(
                "versions",
                "info",
                f"no ROCm runtime installed (kernel {kernel})",
                "",
                "PyTorch's ROCm wheels bring their own; nothing else needs one",
                facts,
            )
        )
    else:
        mixed = len(stacks) > 1 or bool(wheels)
        named = stacks + [f"{w} (a Python environment's own)" for w in wheels]
        result.append(
            Finding(
                "versions",
                "warn" if len(stacks) > 1 else "info",
                f"ROCm: {len(named)} stack(s): {'; '.join(named)}; kernel {kernel}",
                "more than one ROCm stack: a program may load a library of one and the runtime of "
                "another (LD_LIBRARY_PATH, ld.so.conf decide; a Python environment's own ROCm is loaded by its "
                "PyTorch unless the system's comes first)"
                if mixed
                else "gfx1010 regressed in ROCm 5.3 (ROCm/legacy-rocm-build#2527); which libraries of "
                "it carry gfx1010 code is read from the files (rocblas, miopen, hipblaslt, hip)",
                "keep one system stack, and no /opt/rocm* in LD_LIBRARY_PATH for a PyTorch that brings its own"
                if mixed
                else "",
                facts,
            )
        )
    if out_of_tree:
        # DKMS keeps a folder per package it manages: ours is rdna1-amdgpu, AMD's amdgpu-dkms is amdgpu.
        ours = (sysroot / "var/lib/dkms" / PACKAGE_NAME).is_dir()
        result.append(
            Finding(
                "versions",
                "info" if ours else "warn",
                f"an out-of-tree amdgpu for {kernel}: {', '.join(out_of_tree)}",
                "it replaces the kernel's own amdgpu and KFD"
                + ("" if ours else " (AMD's amdgpu-dkms?); rdna1-kmgr's builds and it exclude each other"),
                "",
                facts,
            )
        )
    return result
